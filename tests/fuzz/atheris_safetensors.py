"""Coverage-guided fuzzing (atheris) of the safetensors reader through ckptfs.open; see atheris_target.py.

    python tests/fuzz/atheris_safetensors.py -max_total_time=60 CORPUS_DIR SEED_DIR   (seeds: seeds.py safetensors)
"""

import sys

from atheris_target import run

if __name__ == "__main__":
    run(".safetensors", sys.argv)
