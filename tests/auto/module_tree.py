"""The stage tree instrument.modules should give, computed from the model's named_modules() alone."""


def expected_tree(model, depth, root):
    """stage path of each module with a stage, from named_modules() alone: a module's level counts its
    dotted prefixes that are modules with a forward of their own; its parent is the nearest such prefix."""
    from torch import nn
    named = dict(model.named_modules())
    own = {q for q, m in named.items() if q and type(m).forward is not nn.Module.forward}

    def level(q):
        parts = q.split(".")
        return sum(".".join(parts[:i]) in own for i in range(1, len(parts) + 1))
    chosen = {q for q in own if depth is None or level(q) <= depth}

    def path(q):
        parts = q.split(".")
        ancestors = [".".join(parts[:i]) for i in range(1, len(parts))]
        return (root,) + tuple(a for a in ancestors if a in chosen) + (q,)
    return {(root,)} | {path(q) for q in chosen}
