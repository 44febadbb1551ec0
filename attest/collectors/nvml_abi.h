// The small part of NVML's C ABI (nvml.h) that the NVML loader calls, declared here so that
// Cloister builds without the NVIDIA SDK and loads libnvidia-ml.so.1 only at run time
// (shared/specs/attestation-formats.md section 11). Struct layouts and enum values are NVML's;
// the sizes are checked below against the published ones. Plain C declarations so that a
// test-only stand-in library can be built from them too.
// Internal to attest/collectors/; not part of the public API. Thread-safety: declarations only.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int cloister_nvmlReturn_t;                             // nvmlReturn_t
typedef struct cloister_nvmlDevice_st* cloister_nvmlDevice_t;  // nvmlDevice_t (opaque)

// nvmlConfComputeSystemState_t
typedef struct {
  uint32_t environment;   // 0 unavailable, 1 simulation, 2 hardware
  uint32_t ccFeature;     // 0 off, 1 on
  uint32_t devToolsMode;  // 0 off, 1 on
} cloister_nvmlConfComputeSystemState_t;

// nvmlConfComputeSystemCaps_t
typedef struct {
  uint32_t cpuCaps;   // 0 none, 1 AMD SEV, 2 Intel TDX, 3 AMD SEV-SNP, 4 AMD SNP vTOM, ...
  uint32_t gpusCaps;  // 0 none, 1 CC capable
} cloister_nvmlConfComputeSystemCaps_t;

#define CLOISTER_NVML_CC_GPU_ATTESTATION_REPORT_SIZE 0x2000
#define CLOISTER_NVML_CC_GPU_CEC_ATTESTATION_REPORT_SIZE 0x1000
#define CLOISTER_NVML_CC_GPU_CERT_CHAIN_SIZE 0x1000
#define CLOISTER_NVML_CC_GPU_ATTESTATION_CERT_CHAIN_SIZE 0x1400
#define CLOISTER_NVML_CC_NONCE_SIZE 32

// nvmlConfComputeGpuAttestationReport_t: `nonce` is input, the rest output.
typedef struct {
  uint32_t isCecAttestationReportPresent;
  uint32_t attestationReportSize;
  uint32_t cecAttestationReportSize;
  uint8_t nonce[CLOISTER_NVML_CC_NONCE_SIZE];
  uint8_t attestationReport[CLOISTER_NVML_CC_GPU_ATTESTATION_REPORT_SIZE];
  uint8_t cecAttestationReport[CLOISTER_NVML_CC_GPU_CEC_ATTESTATION_REPORT_SIZE];
} cloister_nvmlConfComputeGpuAttestationReport_t;

// nvmlConfComputeGpuCertificate_t: attestationCertChain is the PEM chain the verifiers use.
typedef struct {
  uint32_t certChainSize;
  uint32_t attestationCertChainSize;
  uint8_t certChain[CLOISTER_NVML_CC_GPU_CERT_CHAIN_SIZE];
  uint8_t attestationCertChain[CLOISTER_NVML_CC_GPU_ATTESTATION_CERT_CHAIN_SIZE];
} cloister_nvmlConfComputeGpuCertificate_t;

// Buffer sizes NVML documents for its string queries.
#define CLOISTER_NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80
#define CLOISTER_NVML_DEVICE_VBIOS_VERSION_BUFFER_SIZE 32
#define CLOISTER_NVML_DEVICE_UUID_V2_BUFFER_SIZE 96

// nvmlDeviceArchitecture_t values.
#define CLOISTER_NVML_DEVICE_ARCH_HOPPER 9
#define CLOISTER_NVML_DEVICE_ARCH_BLACKWELL 10

// Signatures of the entry points the loader resolves with dlsym (names without the prefix).
typedef cloister_nvmlReturn_t (*cloister_nvmlInit_v2_fn)(void);
typedef cloister_nvmlReturn_t (*cloister_nvmlShutdown_fn)(void);
typedef const char* (*cloister_nvmlErrorString_fn)(cloister_nvmlReturn_t);
typedef cloister_nvmlReturn_t (*cloister_nvmlSystemGetDriverVersion_fn)(char*, unsigned int);
typedef cloister_nvmlReturn_t (*cloister_nvmlSystemGetConfComputeState_fn)(
    cloister_nvmlConfComputeSystemState_t*);
typedef cloister_nvmlReturn_t (*cloister_nvmlSystemGetConfComputeCapabilities_fn)(
    cloister_nvmlConfComputeSystemCaps_t*);
typedef cloister_nvmlReturn_t (*cloister_nvmlSystemGetConfComputeGpusReadyState_fn)(uint32_t*);
typedef cloister_nvmlReturn_t (*cloister_nvmlDeviceGetCount_v2_fn)(unsigned int*);
typedef cloister_nvmlReturn_t (*cloister_nvmlDeviceGetHandleByIndex_v2_fn)(unsigned int,
                                                                           cloister_nvmlDevice_t*);
typedef cloister_nvmlReturn_t (*cloister_nvmlDeviceGetArchitecture_fn)(cloister_nvmlDevice_t,
                                                                       unsigned int*);
typedef cloister_nvmlReturn_t (*cloister_nvmlDeviceGetVbiosVersion_fn)(cloister_nvmlDevice_t, char*,
                                                                       unsigned int);
typedef cloister_nvmlReturn_t (*cloister_nvmlDeviceGetUUID_fn)(cloister_nvmlDevice_t, char*,
                                                               unsigned int);
typedef cloister_nvmlReturn_t (*cloister_nvmlDeviceGetConfComputeGpuAttestationReport_fn)(
    cloister_nvmlDevice_t, cloister_nvmlConfComputeGpuAttestationReport_t*);
typedef cloister_nvmlReturn_t (*cloister_nvmlDeviceGetConfComputeGpuCertificate_fn)(
    cloister_nvmlDevice_t, cloister_nvmlConfComputeGpuCertificate_t*);

#ifdef __cplusplus
}  // extern "C"

static_assert(sizeof(cloister_nvmlConfComputeSystemState_t) == 12);
static_assert(sizeof(cloister_nvmlConfComputeSystemCaps_t) == 8);
static_assert(sizeof(cloister_nvmlConfComputeGpuAttestationReport_t) == 12332);
static_assert(sizeof(cloister_nvmlConfComputeGpuCertificate_t) == 9224);
#endif
