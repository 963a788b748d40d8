/// @file api.h
/// Symbol visibility: the library is built with -fvisibility=hidden and exports only what is marked
/// MWMS_API (NCCL's NCCL_API idea).
#pragma once

/// Marks a class or function as part of libmwms's exported ABI: `visibility("default")` with
/// GCC/Clang, empty elsewhere. Every public declaration carries it; anything without it is internal
/// and not reachable from a shared libmwms.so. Users never need to write it themselves.
#if defined(_WIN32)
#define MWMS_API
#else
#define MWMS_API __attribute__((visibility("default")))
#endif
