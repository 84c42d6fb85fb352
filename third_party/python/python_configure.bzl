"""Finds the headers of Debian's /usr/bin/python3 (not the first python3 on PATH)
and the wheel tag an extension built against them carries
(@local_python//:wheel_tag.bzl: PYTHON_WHEEL_TAG, e.g. cp311-cp311-linux_x86_64)."""

def _debian_python_configure_impl(ctx):
    python = ctx.os.environ.get("MEMWALL_PYTHON", "/usr/bin/python3")
    result = ctx.execute([
        python,
        "-c",
        "; ".join([
            "import sys, sysconfig",
            "print(sysconfig.get_paths()['include'])",
            # PEP 425: interpreter, ABI (no flags since 3.8) and platform tags.
            "v = 'cp%d%d' % sys.version_info[:2]",
            "print(v + '-' + v + '-' + sysconfig.get_platform().replace('-', '_').replace('.', '_'))",
        ]),
    ])
    if result.return_code != 0:
        fail("memwall: cannot run %s to find Python headers: %s" % (python, result.stderr))
    include, wheel_tag = result.stdout.strip().split("\n")
    ctx.symlink(include, "include")
    ctx.file("WORKSPACE", 'workspace(name = "%s")\n' % ctx.name)
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

# Headers of {python} ({include}).
cc_library(
    name = "python_headers",
    hdrs = glob(["include/**/*.h"]),
    includes = ["include"],
)

exports_files(["python3"])
""".format(python = python, include = include))
    ctx.symlink(python, "python3")
    ctx.file("wheel_tag.bzl", 'PYTHON_WHEEL_TAG = "%s"\n' % wheel_tag)

debian_python_configure = repository_rule(
    implementation = _debian_python_configure_impl,
    environ = ["MEMWALL_PYTHON"],
    local = True,
)
