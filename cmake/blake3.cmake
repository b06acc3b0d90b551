# The official BLAKE3 C sources, as shipped by Debian's librust-blake3-dev.
file(GLOB _b3_candidates /usr/share/cargo/registry/blake3-*/c/blake3.c)
if(NOT _b3_candidates)
  message(FATAL_ERROR "BLAKE3 C sources not found: apt-get install librust-blake3-dev")
endif()
list(SORT _b3_candidates)
list(GET _b3_candidates -1 _b3_main)
get_filename_component(BLAKE3_DIR ${_b3_main} DIRECTORY)
message(STATUS "BLAKE3 C sources: ${BLAKE3_DIR}")

set(_b3_srcs ${BLAKE3_DIR}/blake3.c ${BLAKE3_DIR}/blake3_dispatch.c
             ${BLAKE3_DIR}/blake3_portable.c)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  # The assembly implementations carry their own runtime CPU dispatch.
  list(APPEND _b3_srcs
       ${BLAKE3_DIR}/blake3_sse2_x86-64_unix.S ${BLAKE3_DIR}/blake3_sse41_x86-64_unix.S
       ${BLAKE3_DIR}/blake3_avx2_x86-64_unix.S ${BLAKE3_DIR}/blake3_avx512_x86-64_unix.S)
  set(_b3_defs)
elseif(CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64|arm64")
  list(APPEND _b3_srcs ${BLAKE3_DIR}/blake3_neon.c)
  set(_b3_defs BLAKE3_USE_NEON=1)
else()
  set(_b3_defs BLAKE3_NO_SSE2 BLAKE3_NO_SSE41 BLAKE3_NO_AVX2 BLAKE3_NO_AVX512)
endif()
add_library(blake3 STATIC ${_b3_srcs})
target_include_directories(blake3 SYSTEM PUBLIC ${BLAKE3_DIR})
target_compile_definitions(blake3 PRIVATE ${_b3_defs})
# Third-party code: keep our warning flags off it.
target_compile_options(blake3 PRIVATE -w -Wno-error)
set_target_properties(blake3 PROPERTIES POSITION_INDEPENDENT_CODE ON)
