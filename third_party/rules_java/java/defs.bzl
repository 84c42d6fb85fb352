"""Offline shim: re-exports Bazel 4.2.3's native Java rules under @rules_java.

@bazel_tools//tools/jdk (registered for every build) loads this file; the real
rules_java would be downloaded. memwall has no Java code.
"""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_plugin = native.java_plugin
java_runtime = native.java_runtime
java_test = native.java_test
java_toolchain = native.java_toolchain
