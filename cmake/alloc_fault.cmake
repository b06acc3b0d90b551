# Allocation-failure tests (docs/testing.md, "Allocation-failure testing"):
# tests/alloc_fault/test_<lib>_<what>.c, each linked with the fault-injecting
# allocator (tests/alloc_fault/alloc_fault.c) through the linker's --wrap,
# against lmc_<lib>, and registered as the ctest alloc_fault.<lib>_<what>.
# `make alloc-fault` builds them in build-fault (Debug, ASan+UBSan).
option(LMC_ALLOC_FAULT "Build the allocation-failure tests (docs/testing.md)" OFF)
if(NOT LMC_ALLOC_FAULT)
  return()
endif()

set(_af_dir ${CMAKE_SOURCE_DIR}/tests/alloc_fault)
# Our code allocates through these only (no posix_memalign / aligned_alloc
# in src/); a block from anything else is freed through the wrapper as a
# stranger and passes through uncounted.  jansson's loaders are wrapped to
# make each call one failure point (tests/alloc_fault/alloc_fault.c).
set(_af_wrap "LINKER:--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,--wrap=strdup,--wrap=strndup"
             "LINKER:--wrap=json_loads,--wrap=json_loadb")

# msgpack-c's static archive, linked whole: its zone allocations (every
# decoded RPC argument) then go through the wrappers like ours.  Without
# it the tests still run, with msgpack-c's allocations out of reach.
find_library(LMC_MSGPACK_STATIC NAMES libmsgpackc.a HINTS ${MSGPACK_LIBRARY_DIRS})
if(NOT LMC_MSGPACK_STATIC)
  message(STATUS "alloc_fault: no libmsgpackc.a; msgpack-c's own allocations will not fail")
endif()

add_library(lmc_alloc_fault OBJECT ${_af_dir}/alloc_fault.c)
target_include_directories(lmc_alloc_fault PUBLIC ${_af_dir} ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(lmc_alloc_fault PUBLIC PkgConfig::JANSSON Threads::Threads)

add_custom_target(alloc_fault)
file(GLOB _af_tests CONFIGURE_DEPENDS ${_af_dir}/test_*.c)
foreach(_t ${_af_tests})
  get_filename_component(_name ${_t} NAME_WE)
  string(REGEX REPLACE "^test_" "" _name ${_name})
  # The library is the longest "_"-separated prefix naming an lmc_ target
  # (test_storage_l2_x.c -> lmc_storage_l2, test_storage_x.c -> lmc_storage).
  string(REPLACE "_" ";" _parts ${_name})
  set(_prefix "")
  set(_lib "")
  foreach(_p ${_parts})
    if(_prefix)
      set(_prefix "${_prefix}_${_p}")
    else()
      set(_prefix ${_p})
    endif()
    if(TARGET lmc_${_prefix})
      set(_lib lmc_${_prefix})
    endif()
  endforeach()
  if(NOT _lib)
    message(FATAL_ERROR "${_t}: name it test_<lib>_<what>.c after a library lmc_<lib>")
  endif()
  set(_exe alloc_fault_${_name})
  add_executable(${_exe} ${_t})
  target_link_libraries(${_exe} PRIVATE lmc_alloc_fault ${_lib} PkgConfig::CMOCKA)
  target_link_options(${_exe} PRIVATE ${_af_wrap})
  if(LMC_MSGPACK_STATIC)
    target_link_options(${_exe} PRIVATE "LINKER:--whole-archive" ${LMC_MSGPACK_STATIC}
                        "LINKER:--no-whole-archive")
  endif()
  # Leak reports name the allocating function (dladdr needs the symbols).
  set_target_properties(${_exe} PROPERTIES ENABLE_EXPORTS ON)
  add_dependencies(alloc_fault ${_exe})
  add_test(NAME alloc_fault.${_name} COMMAND ${_exe})
  set_tests_properties(alloc_fault.${_name} PROPERTIES TIMEOUT 600)
endforeach()
