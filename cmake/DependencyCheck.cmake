# Enforces the dependency arrows of DESIGN.md section 3 at configure time:
#   base <- crypto <- proto <- attest <- enclave,  proto <- host,  attest <- sdk.
# host never links enclave, enclave never links gRPC or host; only tests and bench may link
# both sides. Every library declares its layer with cloister_layer(); a forbidden edge is a
# configure error naming both targets.

set_property(GLOBAL PROPERTY CLOISTER_LAYERED_TARGETS "")

set(_CLOISTER_ALLOWED_base "base")
set(_CLOISTER_ALLOWED_crypto "base;crypto")
set(_CLOISTER_ALLOWED_proto "base;crypto;proto")
set(_CLOISTER_ALLOWED_proto_grpc "base;crypto;proto;proto_grpc")
set(_CLOISTER_ALLOWED_attest "base;crypto;proto;attest")
set(_CLOISTER_ALLOWED_enclave "base;crypto;proto;attest;enclave")
set(_CLOISTER_ALLOWED_gpu "base;crypto;proto;attest;enclave;gpu")
set(_CLOISTER_ALLOWED_host "base;crypto;proto;proto_grpc;host")
set(_CLOISTER_ALLOWED_sdk "base;crypto;proto;proto_grpc;attest;sdk")
set(_CLOISTER_ALLOWED_tools "base;crypto;proto;proto_grpc;attest;enclave;gpu;host;sdk;tools")

# Layers that must never link gRPC (the trusted side stays small).
set(_CLOISTER_NO_GRPC "base;crypto;proto;attest;enclave;gpu")

function(cloister_layer target layer)
  set_property(TARGET ${target} PROPERTY CLOISTER_LAYER ${layer})
  set_property(GLOBAL APPEND PROPERTY CLOISTER_LAYERED_TARGETS ${target})
  if(layer STREQUAL "enclave" OR layer STREQUAL "gpu")
    target_compile_definitions(${target} PRIVATE CLOISTER_ENCLAVE_SIDE=1)
  elseif(layer STREQUAL "host")
    target_compile_definitions(${target} PRIVATE CLOISTER_HOST_SIDE=1)
  endif()
endfunction()

function(cloister_check_dependencies)
  get_property(targets GLOBAL PROPERTY CLOISTER_LAYERED_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(layer ${target} CLOISTER_LAYER)
    set(allowed ${_CLOISTER_ALLOWED_${layer}})
    get_target_property(links ${target} LINK_LIBRARIES)
    get_target_property(ilinks ${target} INTERFACE_LINK_LIBRARIES)
    foreach(dep IN LISTS links ilinks)
      if(NOT dep OR dep MATCHES "-NOTFOUND$")
        continue()
      endif()
      string(REGEX REPLACE "^\\$<LINK_ONLY:(.*)>$" "\\1" dep "${dep}")
      if(TARGET ${dep})
        get_target_property(dep_layer ${dep} CLOISTER_LAYER)
        if(dep_layer AND NOT dep_layer IN_LIST allowed)
          message(FATAL_ERROR "forbidden dependency: ${target} (${layer}) links ${dep} (${dep_layer}); "
                              "see DESIGN.md section 3")
        endif()
      endif()
      if(layer STREQUAL "enclave" AND dep MATCHES "XMLSEC|xmlsec|cloister_attest_nvidia")
        message(FATAL_ERROR "forbidden dependency: ${target} (${layer}) links ${dep}; "
                            "the enclave's allowlist has no XML signature library")
      endif()
      if(layer IN_LIST _CLOISTER_NO_GRPC AND dep MATCHES "grpc")
        message(FATAL_ERROR "forbidden dependency: ${target} (${layer}) links ${dep}; "
                            "the trusted side never links gRPC")
      endif()
    endforeach()
  endforeach()
endfunction()
