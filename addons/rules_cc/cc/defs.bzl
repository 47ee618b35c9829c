"""Offline stand-in for @rules_cc//cc:defs.bzl.

Bazel 4.2.3 still has every C++ rule built in, and its embedded tools only
load these names from @rules_cc, so forwarding to the native rules is all the
real rules_cc would do here.
"""

def cc_binary(**attrs):
    native.cc_binary(**attrs)

def cc_import(**attrs):
    native.cc_import(**attrs)

def cc_library(**attrs):
    native.cc_library(**attrs)

def cc_proto_library(**attrs):
    native.cc_proto_library(**attrs)

def cc_test(**attrs):
    native.cc_test(**attrs)

def cc_toolchain(**attrs):
    native.cc_toolchain(**attrs)

def cc_toolchain_suite(**attrs):
    native.cc_toolchain_suite(**attrs)

def objc_library(**attrs):
    native.objc_library(**attrs)
