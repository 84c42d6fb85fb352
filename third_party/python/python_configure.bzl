"""Finds the headers of Debian's /usr/bin/python3 (not the first python3 on PATH)."""

def _debian_python_configure_impl(ctx):
    python = ctx.os.environ.get("MEMWALL_PYTHON", "/usr/bin/python3")
    result = ctx.execute([
        python,
        "-c",
        "import sysconfig; print(sysconfig.get_paths()['include'])",
    ])
    if result.return_code != 0:
        fail("memwall: cannot run %s to find Python headers: %s" % (python, result.stderr))
    include = result.stdout.strip()
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

debian_python_configure = repository_rule(
    implementation = _debian_python_configure_impl,
    environ = ["MEMWALL_PYTHON"],
    local = True,
)
