#!/usr/bin/env bash
# Shared by the scripts that build ggml from the PyPI sdist llama-cpp-python==0.3.36 (ggml
# 0.25.3, RPC protocol 7.0.0) in a scratch directory: .ci/rpc-server-build.sh (the real
# rpc-server for backend-rpc's interop tests) and crates/cpu-kernels/benches/ggml-matvec-bench.sh
# (ggml's default CPU build for a same-run comparison), and crates/sched/benches/
# ggml-sched-bench.sh (its driver build only). Source it; nothing here is committed
# output, and nothing of ggml is committed.
#
#   GGML_SDIST_VERSION, GGML_SDIST_SHA256  the sdist pinned by version and hash
#   ggml_build_tools                       installs cmake and ninja-build when missing
#   ggml_sdist_unpack DIR                  downloads the sdist into DIR/dl (once), checks its
#                                          hash, unpacks it fresh under DIR/dl and copies ggml
#                                          to DIR/ggml-src with the pkg-config template the
#                                          sdist omits; removes DIR/build and DIR/install.
#                                          Afterwards $GGML_SDIST_TREE is the sdist's llama.cpp
#                                          tree (tools/, vendor/).
#   ggml_build_driver SRC BIN CMD...       a small C++ driver written to SRC.new: reuses BIN
#                                          when it exists and SRC is unchanged, else moves
#                                          SRC.new to SRC, removes BIN and runs CMD (the
#                                          compiler call) to build it again.
# Cost: ~1 min download (76.6 MB).

GGML_SDIST_VERSION=0.3.36
GGML_SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e

ggml_build_tools() {
    if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
        echo "installing cmake and ninja-build" >&2
        local sudo=""
        [[ $(id -u) == 0 ]] || sudo=sudo
        $sudo apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq cmake ninja-build >&2
    fi
}

ggml_sdist_unpack() {
    local dir=$1
    local tarball=$dir/dl/llama_cpp_python-$GGML_SDIST_VERSION.tar.gz
    mkdir -p "$dir/dl"
    if [[ ! -f $tarball ]]; then
        python3 -m pip download --no-deps --no-binary llama-cpp-python \
            "llama-cpp-python==$GGML_SDIST_VERSION" -d "$dir/dl" >&2
    fi
    echo "$GGML_SDIST_SHA256  $tarball" | sha256sum -c - >&2
    rm -rf "$dir/dl/llama_cpp_python-$GGML_SDIST_VERSION" "$dir/ggml-src" "$dir/build" "$dir/install"
    tar xzf "$tarball" -C "$dir/dl"
    GGML_SDIST_TREE=$dir/dl/llama_cpp_python-$GGML_SDIST_VERSION/vendor/llama.cpp
    cp -r "$GGML_SDIST_TREE/ggml" "$dir/ggml-src"
    # The sdist omits ggml/ggml.pc.in, which ggml's standalone CMakeLists needs (pkg-config
    # template).
    cat > "$dir/ggml-src/ggml.pc.in" <<'PC'
prefix=@CMAKE_INSTALL_PREFIX@
exec_prefix=${prefix}
includedir=${prefix}/include
libdir=${prefix}/lib

Name: ggml
Description: The GGML Tensor Library for Machine Learning
Version: @GGML_VERSION@
Cflags: -I${includedir}
Libs: -L${libdir} -lggml
PC
}

ggml_build_driver() {
    local src=$1 bin=$2
    shift 2
    if [[ -x $bin && -f $src ]] && cmp -s "$src" "$src.new"; then
        rm "$src.new"
        echo "cached: $bin" >&2
    else
        mv "$src.new" "$src"
        rm -f "$bin"
        echo "building $bin" >&2
        "$@"
    fi
}
