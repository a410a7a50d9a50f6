"""A straightforward pure-Python BERT tokenizer: the demo's ``baseline`` tokenizer.

BasicTokenizer behaviour (text cleanup, CJK splitting, lowercasing, accent stripping,
punctuation splitting) followed by greedy longest-match-first WordPiece over ``vocab.txt``,
as in the original BERT code. Written plainly on purpose: it is the slow side of the demo.
"""
import re
import unicodedata

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Special tokens written in the text are kept whole, as the fast tokenizer's added tokens are.
_SPECIAL_RE = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")


def _is_whitespace(ch):
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch):
    return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")


def _is_punctuation(ch):
    cp = ord(ch)
    # BERT counts every non-alphanumeric ASCII character as punctuation, "$" and "^" too.
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


def load_vocab(path):
    with open(path, encoding="utf-8") as f:
        return {line.rstrip("\n"): i for i, line in enumerate(f)}


class WordPieceTokenizer:
    """``encode(text) -> list[int]`` with [CLS]/[SEP] and truncation, ``encode_batch`` pads."""

    def __init__(self, vocab_path, max_length=128, max_chars_per_word=100):
        self.vocab = load_vocab(vocab_path)
        self.max_length = max_length
        self.max_chars_per_word = max_chars_per_word
        self.unk_id = self.vocab["[UNK]"]
        self.cls_id = self.vocab["[CLS]"]
        self.sep_id = self.vocab["[SEP]"]
        self.pad_id = self.vocab["[PAD]"]

    def _clean(self, text):
        out = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or _is_control(ch):
                continue
            if _is_whitespace(ch):
                out.append(" ")
            elif _is_cjk(cp):
                out.append(" " + ch + " ")
            else:
                out.append(ch)
        return "".join(out)

    def _split_punctuation(self, word):
        pieces, current = [], []
        for ch in word:
            if _is_punctuation(ch):
                if current:
                    pieces.append("".join(current))
                    current = []
                pieces.append(ch)
            else:
                current.append(ch)
        if current:
            pieces.append("".join(current))
        return pieces

    def basic_tokenize(self, text):
        words = []
        for word in self._clean(text).split():
            word = unicodedata.normalize("NFD", word.lower())
            word = "".join(ch for ch in word if unicodedata.category(ch) != "Mn")
            words.extend(self._split_punctuation(word))
        return words

    def wordpiece(self, word):
        if len(word) > self.max_chars_per_word:
            return [self.unk_id]
        ids, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    break
                end -= 1
            else:
                return [self.unk_id]  # some part of the word is not in the vocabulary
            start = end
        return ids

    def tokenize_ids(self, text):
        """Token ids of ``text`` without special tokens or truncation."""
        ids = []
        for part in _SPECIAL_RE.split(text):
            if part in SPECIAL_TOKENS:
                ids.append(self.vocab[part])
            elif part:
                for word in self.basic_tokenize(part):
                    ids.extend(self.wordpiece(word))
        return ids

    def encode(self, text):
        return [self.cls_id] + self.tokenize_ids(text)[: self.max_length - 2] + [self.sep_id]

    def encode_batch(self, texts, pad_to=None):
        """Ids padded to ``pad_to`` (default: the longest in the batch), as lists of lists, and the true lengths."""
        encoded = [self.encode(t) for t in texts]
        lengths = [len(ids) for ids in encoded]
        width = max(lengths) if pad_to is None else pad_to
        return [ids + [self.pad_id] * (width - len(ids)) for ids in encoded], lengths
