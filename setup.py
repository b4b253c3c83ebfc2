"""Build hook for the optional C kernels; all other metadata lives in pyproject.toml.

The extension is ``optional``: if it fails to compile, installation continues and ckptfs decodes with numpy.
-ffp-contract=off keeps the compiler from fusing multiply-adds, which would change float32 rounding and
break bit-exactness with ggml and with the numpy path.
"""

import sys

from setuptools import Extension, setup

flags = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off"]
setup(ext_modules=[Extension("ckptfs.quant._native", ["ckptfs/quant/_native.c"],
                             extra_compile_args=flags, depends=["ckptfs/quant/float_bits.h"], optional=True),
                   # the mount's folder listings handed to libfuse in one loop (fuse/binding.py)
                   Extension("ckptfs.fuse._listing", ["ckptfs/fuse/_listing.c"], extra_compile_args=flags,
                             optional=True),
                   # reads of stored bytes answered in C, without the GIL (fuse/direct.py)
                   Extension("ckptfs.fuse._direct", ["ckptfs/fuse/_direct.c"], extra_compile_args=flags,
                             depends=["ckptfs/sources/chunk_sum.h", "ckptfs/quant/scaled_rows.h",
                                      "ckptfs/quant/nibble_pairs.h", "ckptfs/quant/float_bits.h"], optional=True),
                   # the served checksums of Python's reads summed without the GIL (sources/served.py)
                   Extension("ckptfs.sources._sums", ["ckptfs/sources/_sums.c"], extra_compile_args=flags,
                             depends=["ckptfs/sources/chunk_sum.h"], optional=True),
                   # the string arrays of a GGUF header (a vocabulary) walked in one loop (formats/gguf_values.py)
                   Extension("ckptfs.formats._strings", ["ckptfs/formats/_strings.c"], extra_compile_args=flags,
                             optional=True),
                   # GPTQ / AWQ rows decoded in one pass (packed/native.py)
                   Extension("ckptfs.packed._kernels", ["ckptfs/packed/_kernels.c"], extra_compile_args=flags,
                             depends=["ckptfs/quant/float_bits.h", "ckptfs/quant/scaled_rows.h",
                                      "ckptfs/quant/nibble_pairs.h"], optional=True),
                   # bitsandbytes NF4/FP4 and LLM.int8 rows decoded in one pass (packed/bnb.py)
                   Extension("ckptfs.packed._bnb", ["ckptfs/packed/_bnb.c"], extra_compile_args=flags,
                             depends=["ckptfs/quant/nibble_pairs.h", "ckptfs/quant/scaled_rows.h",
                                      "ckptfs/quant/float_bits.h"], optional=True),
                   # remote range GETs through libcurl without the GIL (sources/remote/curl.py); needs Debian's
                   # libcurl4-openssl-dev, else the range GETs stay on urllib3
                   Extension("ckptfs.sources.remote._curl", ["ckptfs/sources/remote/_curl.c"],
                             extra_compile_args=flags, libraries=["curl"], optional=True)])
