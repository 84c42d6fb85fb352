"""memwall's build macros: the one place for copts, CUDA archs and tags.

  memwall_cc_library    a C++ library of ours
  memwall_cc_test       a GoogleTest test (linked statically; `gpu` tag opt-in)
  memwall_cuda_library  .cu sources compiled by nvcc for $(MEMWALL_CUDA_ARCHS);
                        an empty library when no CUDA toolkit is found
  memwall_mpi_test      one gtest binary run under `mpirun -np N` for each N
  memwall_cc_benchmark  a Google Benchmark binary (tag `benchmark`)
  memwall_cc_binary     a tool or repro binary
  memwall_fuzz_test     a fuzz target: its corpus replay (a test) and its
                        libFuzzer binary (--config=fuzz, tools/fuzz.sh)

CUDA archs: --define=MEMWALL_CUDA_ARCHS=80,90 (the default, set in .bazelrc).
"""

load("@local_cuda//:defs.bzl", "CUDA_ENABLED", "NVCC")

MEMWALL_COPTS = [
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-Wno-sign-compare",
    "-Wno-missing-field-initializers",
]

def memwall_cc_library(name, copts = [], **kwargs):
    native.cc_library(
        name = name,
        copts = MEMWALL_COPTS + copts,
        **kwargs
    )

def memwall_cc_binary(name, copts = [], **kwargs):
    native.cc_binary(
        name = name,
        copts = MEMWALL_COPTS + copts,
        **kwargs
    )

def memwall_cc_test(name, copts = [], deps = [], tags = [], gtest_main = True, **kwargs):
    native.cc_test(
        name = name,
        copts = MEMWALL_COPTS + copts,
        deps = deps + (["@com_google_googletest//:gtest_main"] if gtest_main else ["@com_google_googletest//:gtest"]),
        linkstatic = True,
        tags = tags,
        **kwargs
    )

def memwall_cc_benchmark(name, copts = [], deps = [], tags = [], **kwargs):
    native.cc_binary(
        name = name,
        copts = MEMWALL_COPTS + copts,
        deps = deps + ["@com_github_google_benchmark//:benchmark_main"],
        tags = tags + ["benchmark"],
        **kwargs
    )

def memwall_cuda_library(name, srcs = [], hdrs = [], deps = [], cuda_hdrs = [], stub_srcs = [], **kwargs):
    """A cc_library whose .cu sources nvcc compiles into a static archive.

    `hdrs` are the library's public headers (plain C++, includable without
    CUDA); `cuda_hdrs` are further headers the .cu files include. Without a
    toolkit the library is built from `stub_srcs` instead (C++ definitions of
    the same functions that report "built without CUDA"), so callers link
    either way and decide at run time.
    """
    if not CUDA_ENABLED:
        native.cc_library(name = name, srcs = stub_srcs, hdrs = hdrs, deps = deps, copts = MEMWALL_COPTS, **kwargs)
        return
    archive = "lib%s_cu.a" % name
    native.genrule(
        name = name + "_nvcc",
        srcs = srcs + hdrs + cuda_hdrs,
        outs = [archive],
        cmd = """
archs="$(MEMWALL_CUDA_ARCHS)"
gencode=""
last=""
for a in $${archs//,/ }; do gencode="$$gencode -gencode arch=compute_$$a,code=sm_$$a"; last=$$a; done
gencode="$$gencode -gencode arch=compute_$$last,code=compute_$$last"
%s -lib -std=c++20 -O3 -Xcompiler -fPIC -I. -I$(GENDIR) -DMEMWALL_HAS_CUDA=1 $$gencode \
    -o $@ %s
""" % (NVCC, " ".join(["$(location %s)" % s for s in srcs])),
        message = "nvcc " + name,
    )
    native.cc_import(
        name = name + "_cu",
        static_library = archive,
        alwayslink = True,
    )
    native.cc_library(
        name = name,
        hdrs = hdrs,
        deps = deps + [":" + name + "_cu", "@local_cuda//:cudart"],
        **kwargs
    )

def memwall_mpi_test(name, srcs = [], deps = [], ranks = [1, 2, 4], tags = [], size = "medium", copts = [], **kwargs):
    """Runs one gtest binary under `mpirun -np N --oversubscribe` for each N.

    Creates `<name>_bin` and one sh_test `<name>_np<N>` per N, gathered in the
    test_suite `<name>`. Tagged `gpu`, it skips without a GPU here and its
    binary goes into the GPU bundle, which runs it at 2 ranks.
    """
    native.cc_binary(
        name = name + "_bin",
        srcs = srcs,
        copts = MEMWALL_COPTS + copts,
        deps = deps + ["@com_google_googletest//:gtest_main", "@openmpi//:mpi"],
        testonly = True,
        # A `gpu` binary goes into the GPU bundle (tools/gpu_bundle.sh), which
        # runs it at several ranks with its own launcher.
        tags = [t for t in tags if t == "gpu"],
        **kwargs
    )
    tests = []
    for n in ranks:
        test_name = "%s_np%d" % (name, n)
        native.sh_test(
            name = test_name,
            srcs = ["//tools:mpi_test_runner.sh"],
            args = [str(n), "$(location :%s_bin)" % name],
            data = [":" + name + "_bin"],
            size = size,
            tags = tags + ["mpi"],
        )
        tests.append(":" + test_name)
    native.test_suite(name = name, tests = tests, tags = tags)

def memwall_fuzz_test(name, srcs, deps = [], mutations = 20000, size = "small", **kwargs):
    """A fuzz target: `srcs` define LLVMFuzzerTestOneInput (tools/fuzz.h).

    Its corpus is the files under `<name>_corpus/` in this package (seeds,
    and every past finding). Creates
      <name>_test  replays the corpus and `mutations` deterministic mutations
                   of it (tools/fuzz_replay.cc), built like any test: CI
                   runs it on every build, and under --config=asan;
      <name>       the libFuzzer binary (tag manual): only with --config=fuzz
                   (clang, in an output base of its own: tools/fuzz.sh).
    """
    corpus = native.glob([name + "_corpus/*"])
    native.cc_library(
        name = name + "_target",
        srcs = srcs,
        copts = MEMWALL_COPTS,
        deps = deps + ["//tools:fuzz"],
        testonly = True,
        alwayslink = True,
    )
    native.cc_test(
        name = name + "_test",
        copts = MEMWALL_COPTS,
        deps = [":" + name + "_target", "//tools:fuzz_replay"],
        data = corpus,
        args = ["%s/%s_corpus" % (native.package_name(), name), str(mutations)],
        linkstatic = True,
        size = size,
        **kwargs
    )
    native.cc_binary(
        name = name,
        deps = [":" + name + "_target"],
        linkopts = select({
            "//tools:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        testonly = True,
        tags = ["manual"],
    )
