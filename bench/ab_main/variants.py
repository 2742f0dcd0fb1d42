"""Rounds only (bwd64): write variants of the branch's ordered-kernel module to /tmp for the
ab's "module" override: t2 (dQ converted two tiles a block), rot (D 64
with the mask: the longest walks launched first)."""

SRC = "kaio_ops/_attention_hopper_bwd_fused.py"
T2 = ("CONVERT_T = {64: 1, 128: 1}", "CONVERT_T = {64: 2, 128: 2}")
ROT = ("ROT = {64: (False, False), 128: (True, False)}", "ROT = {64: (False, True), 128: (True, False)}")


def write(name, edits):
    s = open(SRC).read()
    for old, new in edits:
        assert s.count(old) == 1, old
        s = s.replace(old, new)
    open(f"/tmp/fused_{name}.py", "w").write(s)


write("t2", [T2])
write("rot", [ROT])
