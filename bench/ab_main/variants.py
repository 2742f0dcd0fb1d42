"""Rounds only (bwd64): write variants of the branch's ordered-kernel module to /tmp for the
ab's "module" override: nobehind (dQ converted by dq_convert_rows after the kernel at D 64
too)."""

SRC = "kaio_ops/_attention_hopper_bwd_fused.py"
NOBEHIND = ("BEHIND = {64: True, 128: False}", "BEHIND = {64: False, 128: False}")


def write(name, edits):
    s = open(SRC).read()
    for old, new in edits:
        assert s.count(old) == 1, old
        s = s.replace(old, new)
    open(f"/tmp/fused_{name}.py", "w").write(s)


write("nobehind", [NOBEHIND])
