"""Coverage-guided fuzzing (atheris) of the GGUF reader through ckptfs.open; see atheris_target.py.

    python tests/fuzz/atheris_gguf.py -max_total_time=60 CORPUS_DIR SEED_DIR   (seeds: python seeds.py gguf DIR)
"""

import sys

from atheris_target import run

if __name__ == "__main__":
    run(".gguf", sys.argv)
