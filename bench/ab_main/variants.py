"""Rounds only (bwd64): write variants of the branch's ordered-kernel module to /tmp for the
ab's "module" override: t2 (dQ converted two tiles a block)."""

SRC = "kaio_ops/_attention_hopper_bwd_fused.py"
T2 = ("CONVERT_T = {64: 1, 128: 1}", "CONVERT_T = {64: 2, 128: 2}")


def write(name, edits):
    s = open(SRC).read()
    for old, new in edits:
        assert s.count(old) == 1, old
        s = s.replace(old, new)
    open(f"/tmp/fused_{name}.py", "w").write(s)


write("t2", [T2])
