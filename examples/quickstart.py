"""A small pipeline annotated with instrument: run it, read the breakdown."""
import time

import instrument

TOKENIZE = instrument.stage("tokenize")


@instrument.region("forward")
def forward(tokens):
    return sum(i * i for i in range(20000 * len(tokens)))


def serve(text):
    with instrument.stage("request"):
        with TOKENIZE:
            tokens = text.lower().split()
        with instrument.stage("wait_for_batch"):
            time.sleep(0.002)
        forward(tokens)


if __name__ == "__main__":
    for i in range(50):
        serve("the quick brown fox jumps over the lazy dog " * (1 + i % 3))
    instrument.report()
    print("saved", instrument.snapshot().save("quickstart.json"))
