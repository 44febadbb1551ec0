// The CUDA executor's operator table: for every operator of the CPU executor, a kernel that
// validates and infers shapes through the CPU kernel's factory (so both executors accept exactly
// the same models and agree on every output's type and shape) and then runs on the device where
// this file has a device implementation for the node's types and attributes.
//
// Residency rules (README.md): values live on the device; a node whose inputs are all on the
// host (shape arithmetic fed by Shape/Size) runs its CPU kernel on the host; operands that
// decide output shapes (Reshape's shape, Slice's starts, Pad's pads, If's condition...) are read
// on the host, from the load-time constant or by a download. A node without a device
// implementation runs on the host with copies (explicit per-node host fallback, logged at load);
// with `allow_host_fallback` false such a node fails Model::Load instead.
//
// Threading: the registry is built once; kernels are immutable and run concurrently, each run
// with its own CudaRunState. Ownership: kernels own their CPU twin and device constants.
#pragma once

#include "enclave/runtime/kernel.h"

namespace cloister::gpu {

// Fills `registry` with CUDA kernels wrapping every operator of `cpu`.
void RegisterCudaKernels(const runtime::KernelRegistry& cpu, bool allow_host_fallback,
                         runtime::KernelRegistry& registry);

}  // namespace cloister::gpu
