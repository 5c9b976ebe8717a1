"""cpu-static64's winners compiled by the v5e's own compiler, deviceless.

The suite searches on 64 simulated CPU devices and prices XLA:CPU's program
with a v5e-class model under 16 GiB per device, a v5e chip's HBM. Whether a
winner fits a v5e is the chip's compiler's call: this compiles an entry's
exported winner (`rules/cpu-static64/<id>.json`) and the expert plans named
after it for a deviceless v5e topology of the entry's mesh, and prints one
JSON line per plan (the compiler's peak memory, or its refusal, and the
`tpu-v5e` model's estimate of the chip's program), as
`benchmarks/cpu-static256/target_check.py` does for the v5p:

    python benchmarks/cpu-static64/target_check.py llama:7b llama-7b-dp8-tp8-16gib \
        dp=8,tp=8 winner fsdp
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cpu-static256"))
from target_check import check  # it sets up one CPU device first

if __name__ == "__main__":
    check("cpu-static64", sys.argv[1], "tpu-v5e", sys.argv[2], sys.argv[3], sys.argv[4:])
