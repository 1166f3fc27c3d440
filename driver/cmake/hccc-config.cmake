# hccc-config.cmake -- find_package(hccc) support, shipped with the hccc Python package.
#
#   find_package(hccc REQUIRED)            # hccc_DIR=$(hccc --cmake-dir), or hccc on PATH
#   hccc_add_collective(<target> <algo.rccl|algo.xml|program.json>
#                       [TOPOLOGY <cluster.topo>] [TARGET auto|cuda|hip|all]
#                       [CODEGEN specialized|table] [OUTPUT_DIR <dir>]
#                       [DTYPES <dtype>...] [OPS <op>...] [HCCC_ARGS <hccc option>...])
#
# At configure time hccc lists the files the compile writes (hccc ALGO -o DIR --list-outputs);
# at build time a custom command runs the compile, with a depfile naming the algorithm, the
# cluster and hccc's own files, so a change to any of them regenerates and rebuilds. A change to
# the algorithm also re-runs the configure step (its name or rank count may change the list).
#
# CODEGEN specialized (default): <target> is a static library of one translation unit per rank
# (CUDA ranks with the CUDA language, HIP ranks with the HIP language or hipcc). With ranks of both
# platforms (TARGET all, or a mixed cluster), <target>_cuda and <target>_hip are the libraries and
# <target> an interface library linking both.
# CODEGEN table: nothing is compiled per algorithm. <target> is an interface library that links
# hccc::table_cuda / hccc::table_hip (the generic kernels, built once per build tree) and depends
# on the generation of the tables. The directory with manifest.json, the table and the headers is
# the target property HCCC_OUTPUT_DIR (also in the variable <target>_HCCC_OUTPUT_DIR).
# DTYPES / OPS: kernel instantiations (default: the cache variables HCCC_DTYPES / HCCC_OPS, all).
# CUDA kernels need the CUDA language enabled by the project; HIP kernels use the HIP language when
# enabled, hipcc otherwise. HCCC_EMULATE_ON_CPU=ON compiles every kernel with the C++ compiler
# against the CPU emulation header instead (no GPU toolchain needed).
include_guard(GLOBAL)
cmake_minimum_required(VERSION 3.21)

if(NOT HCCC_EXECUTABLE)
  find_program(HCCC_EXECUTABLE hccc DOC "the hccc compiler")
endif()
if(NOT HCCC_EXECUTABLE)
  set(hccc_FOUND FALSE)
  set(hccc_NOT_FOUND_MESSAGE "the hccc executable was not found (set HCCC_EXECUTABLE)")
  return()
endif()
execute_process(COMMAND ${HCCC_EXECUTABLE} --version OUTPUT_VARIABLE _hccc_version_out
                RESULT_VARIABLE _hccc_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _hccc_rc EQUAL 0)
  set(hccc_FOUND FALSE)
  set(hccc_NOT_FOUND_MESSAGE "${HCCC_EXECUTABLE} --version failed")
  return()
endif()
string(REGEX REPLACE "^hccc[ ]+" "" hccc_VERSION "${_hccc_version_out}")

# (hccc.util.dtypes: DTYPES and OPS; tests/test_build_units.py checks the two lists against it)
set(HCCC_KNOWN_DTYPES float32 float16 bfloat16 int32 int64 uint8 float64)
set(HCCC_KNOWN_OPS sum max min prod avg)
set(HCCC_DTYPES "${HCCC_KNOWN_DTYPES}" CACHE STRING "hccc kernel element types to instantiate")
set(HCCC_OPS "${HCCC_KNOWN_OPS}" CACHE STRING "hccc reduction operators to instantiate")
set(HCCC_HIP_PLATFORM "amd" CACHE STRING "HIP_PLATFORM used when hipcc compiles HIP kernels")
option(HCCC_EMULATE_ON_CPU "compile the kernels with the C++ compiler against the CPU emulation header" OFF)

# HCCC_ENABLE_<X>=0|1 definitions for the chosen instantiations.
function(_hccc_instance_defs out dtypes ops)
  set(defs)
  foreach(kind DTYPES OPS)
    string(TOLOWER "${kind}" lkind)
    foreach(x IN LISTS ${lkind})
      if(NOT x IN_LIST HCCC_KNOWN_${kind})
        message(FATAL_ERROR "hccc: unknown ${kind} entry '${x}' (known: ${HCCC_KNOWN_${kind}})")
      endif()
    endforeach()
    foreach(x IN LISTS HCCC_KNOWN_${kind})
      string(TOUPPER "${x}" X)
      if(x IN_LIST ${lkind})
        list(APPEND defs HCCC_ENABLE_${X}=1)
      else()
        list(APPEND defs HCCC_ENABLE_${X}=0)
      endif()
    endforeach()
  endforeach()
  set(${out} ${defs} PARENT_SCOPE)
endfunction()

# A static library <lib> of <platform> translation units <sources> (absolute), including <incdir>.
function(_hccc_platform_library lib platform incdir defs depends_target)
  set(sources ${ARGN})
  get_property(langs GLOBAL PROPERTY ENABLED_LANGUAGES)
  if(HCCC_EMULATE_ON_CPU)
    # the kernels compiled as C++ against hccc_cpu_emu.h (what `hccc run --backend cpu` runs)
    add_library(${lib} STATIC ${sources})
    set_source_files_properties(${sources} PROPERTIES LANGUAGE CXX GENERATED TRUE
                                COMPILE_OPTIONS "-x;c++")
    set_target_properties(${lib} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON
                                            POSITION_INDEPENDENT_CODE ON)
    target_compile_definitions(${lib} PRIVATE ${defs} HCCC_PLATFORM_CPU=1)
  elseif(platform STREQUAL "cuda")
    if(NOT "CUDA" IN_LIST langs)
      message(FATAL_ERROR "hccc: CUDA kernels need the CUDA language: project(... LANGUAGES CXX CUDA) "
                          "or enable_language(CUDA) before hccc_add_collective (or HCCC_EMULATE_ON_CPU=ON)")
    endif()
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    add_library(${lib} STATIC ${sources})
    set_source_files_properties(${sources} PROPERTIES LANGUAGE CUDA GENERATED TRUE)
    set_target_properties(${lib} PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                            POSITION_INDEPENDENT_CODE ON
                                            CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}")
    target_compile_definitions(${lib} PRIVATE ${defs})
  else()
    if(NOT DEFINED CMAKE_HIP_ARCHITECTURES OR CMAKE_HIP_ARCHITECTURES STREQUAL "")
      set(CMAKE_HIP_ARCHITECTURES gfx90a)
    endif()
    if("HIP" IN_LIST langs)
      add_library(${lib} STATIC ${sources})
      set_source_files_properties(${sources} PROPERTIES LANGUAGE HIP GENERATED TRUE)
      set_target_properties(${lib} PROPERTIES HIP_STANDARD 17 HIP_STANDARD_REQUIRED ON
                                              POSITION_INDEPENDENT_CODE ON)
      target_compile_definitions(${lib} PRIVATE ${defs})
    else()
      # no HIP language in this project: hipcc compiles each source to an object
      find_program(HCCC_HIPCC hipcc REQUIRED)
      set(ddefs ${defs})
      list(TRANSFORM ddefs PREPEND -D)
      set(arch ${CMAKE_HIP_ARCHITECTURES})
      list(TRANSFORM arch PREPEND --offload-arch=)
      set(objdir ${CMAKE_CURRENT_BINARY_DIR}/${lib}.objs)
      set(objs)
      foreach(src IN LISTS sources)
        get_filename_component(base "${src}" NAME)
        set(obj ${objdir}/${base}.o)
        add_custom_command(
          OUTPUT ${obj}
          COMMAND ${CMAKE_COMMAND} -E make_directory ${objdir}
          COMMAND ${CMAKE_COMMAND} -E env HIP_PLATFORM=${HCCC_HIP_PLATFORM}
                  ${HCCC_HIPCC} -std=c++17 -O3 -fPIC ${arch} ${ddefs} -I${incdir} -c ${src} -o ${obj}
          DEPENDS ${src} ${depends_target}
          COMMENT "hipcc ${base}"
          VERBATIM)
        list(APPEND objs ${obj})
      endforeach()
      add_library(${lib} STATIC ${objs})
      set_target_properties(${lib} PROPERTIES LINKER_LANGUAGE CXX)
    endif()
  endif()
  target_include_directories(${lib} PUBLIC ${incdir})
endfunction()

# hccc::table_<platform>: the generic table kernels, built once per build tree: the units holding an
# instance of <dtypes> x <ops> (hccc_table_unit<i>.cu / .hip, of balanced cost: the generated
# hccc_table_units.cmake says which), compiled in parallel.
function(_hccc_table_library platform defs dtypes ops)
  set(lib hccc_table_${platform})
  if(TARGET ${lib})
    return()
  endif()
  set(dir ${CMAKE_BINARY_DIR}/hccc_table_kernels)
  execute_process(COMMAND ${HCCC_EXECUTABLE} --table-kernels ${dir} RESULT_VARIABLE rc
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "hccc --table-kernels failed:\n${err}")
  endif()
  include(${dir}/hccc_table_units.cmake)
  hccc_table_units(src ${platform} "${dtypes}" "${ops}")
  list(TRANSFORM src PREPEND ${dir}/)
  _hccc_platform_library(${lib} ${platform} ${dir} "${defs}" "" ${src})
  add_library(hccc::table_${platform} ALIAS ${lib})
endfunction()

function(hccc_add_collective target algo)
  cmake_parse_arguments(PARSE_ARGV 2 A "" "TOPOLOGY;TARGET;CODEGEN;OUTPUT_DIR" "DTYPES;OPS;HCCC_ARGS")
  if(A_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "hccc_add_collective: unknown arguments ${A_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT A_TARGET)
    set(A_TARGET auto)
  endif()
  if(NOT A_CODEGEN)
    set(A_CODEGEN specialized)
  endif()
  if(NOT A_CODEGEN MATCHES "^(specialized|table)$")
    message(FATAL_ERROR "hccc_add_collective: CODEGEN must be specialized or table, not '${A_CODEGEN}'")
  endif()
  if(NOT A_DTYPES)
    set(A_DTYPES ${HCCC_DTYPES})
  endif()
  if(NOT A_OPS)
    set(A_OPS ${HCCC_OPS})
  endif()
  _hccc_instance_defs(defs "${A_DTYPES}" "${A_OPS}")
  foreach(path IN ITEMS "${algo}" "${A_TOPOLOGY}" "${A_OUTPUT_DIR}")
    # a CMake list separator inside a path would split it into two arguments of the compile
    if(path MATCHES ";")
      message(FATAL_ERROR "hccc_add_collective(${target}): the path '${path}' contains ';', which CMake "
                          "reads as a list separator: rename the file or folder")
    endif()
  endforeach()
  get_filename_component(algo "${algo}" ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
  if(A_OUTPUT_DIR)
    get_filename_component(outdir "${A_OUTPUT_DIR}" ABSOLUTE BASE_DIR ${CMAKE_CURRENT_BINARY_DIR})
  else()
    set(outdir ${CMAKE_CURRENT_BINARY_DIR}/${target}.hccc)
  endif()
  set(args ${algo} -o ${outdir} --target ${A_TARGET} --codegen ${A_CODEGEN})
  set(inputs ${algo})
  if(A_TOPOLOGY)
    get_filename_component(topo "${A_TOPOLOGY}" ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    list(APPEND args --topology ${topo})
    list(APPEND inputs ${topo})
  endif()
  list(APPEND args ${A_HCCC_ARGS})

  # what the compile writes, asked of hccc (no names hard-coded here)
  set(lists)
  foreach(which all cuda hip)
    execute_process(COMMAND ${HCCC_EXECUTABLE} ${args} --list-outputs ${which}
                    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "hccc_add_collective(${target}): hccc cannot list the outputs of ${algo}:\n${err}")
    endif()
    string(REGEX REPLACE "\n$" "" out "${out}")
    if(out STREQUAL "")
      set(list_${which})
    else()
      string(REPLACE "\n" ";" list_${which} "${out}")
    endif()
  endforeach()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${inputs})

  add_custom_command(
    OUTPUT ${list_all}
    COMMAND ${HCCC_EXECUTABLE} ${args} --depfile ${outdir}.d
    DEPENDS ${inputs}
    DEPFILE ${outdir}.d
    COMMENT "hccc: generating ${target} from ${algo}"
    VERBATIM)
  add_custom_target(${target}_generate DEPENDS ${list_all})

  set(platforms)
  foreach(pl cuda hip)
    if(list_${pl})
      list(APPEND platforms ${pl})
    endif()
  endforeach()
  list(LENGTH platforms nplat)

  if(A_CODEGEN STREQUAL "table")
    add_library(${target} INTERFACE)
    add_dependencies(${target} ${target}_generate)
    foreach(pl IN LISTS platforms)
      _hccc_table_library(${pl} "${defs}" "${A_DTYPES}" "${A_OPS}")
      target_link_libraries(${target} INTERFACE hccc::table_${pl})
    endforeach()
  else()
    set(libs)
    foreach(pl IN LISTS platforms)
      if(nplat GREATER 1)
        set(lib ${target}_${pl})
      else()
        set(lib ${target})
      endif()
      _hccc_platform_library(${lib} ${pl} ${outdir} "${defs}" ${target}_generate ${list_${pl}})
      add_dependencies(${lib} ${target}_generate)
      list(APPEND libs ${lib})
    endforeach()
    if(nplat GREATER 1)
      add_library(${target} INTERFACE)
      target_link_libraries(${target} INTERFACE ${libs})
    endif()
  endif()
  target_include_directories(${target} INTERFACE ${outdir})
  set_property(TARGET ${target} PROPERTY HCCC_OUTPUT_DIR ${outdir})
  set(${target}_HCCC_OUTPUT_DIR ${outdir} PARENT_SCOPE)
endfunction()
