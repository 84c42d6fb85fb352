"""Offline shim: re-exports Bazel 4.2.3's native C++ rules under @rules_cc.

Debian's bazel-rules-cc is too new for Bazel 4.2.3 (it loads use_cpp_toolchain),
so memwall carries this shim instead. See docs/build.md in the repository.
"""

cc_binary = native.cc_binary
cc_import = native.cc_import
cc_library = native.cc_library
cc_proto_library = native.cc_proto_library
cc_shared_library = getattr(native, "cc_shared_library", None)
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
fdo_prefetch_hints = native.fdo_prefetch_hints
fdo_profile = native.fdo_profile
objc_import = native.objc_import
objc_library = native.objc_library
