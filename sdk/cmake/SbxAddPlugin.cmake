# sbx_add_plugin(): builds an sbx provider plugin. Installed with the CMake package
# (find_package(sbx) includes it) and included by sdk/CMakeLists.txt inside the sbx build, so a
# plugin's CMakeLists.txt reads the same in both.
#
#   sbx_add_plugin(<target> [C] [OUTPUT_DIRECTORY <dir>] SOURCES <src>...)
#
# makes <target>.so, a MODULE library whose only exported symbol is sbx_plugin_entry: sources are
# compiled with hidden visibility, and the linker gets the version script plugin.version (next to
# this file) and -Wl,--no-undefined, so that a symbol missing at link time is an error now, not a
# failed dlopen in the host later.
#   C                 a plain-C plugin: links sbx::abi (the C headers) only, with C11 at least;
#                     without it the plugin links the C++ SDK, sbx::sdk (C++20).
#   OUTPUT_DIRECTORY  where the .so goes; default: ${SBX_PLUGIN_OUTPUT_DIR} if set, else the
#                     target's default (CMAKE_LIBRARY_OUTPUT_DIRECTORY or the current binary dir).
# Link more libraries as usual, e.g. target_link_libraries(<target> PRIVATE sbx::sdk_http).
# Sanitizer builds need the sanitizer's runtime symbols unresolved at link time: set SBX_SANITIZE
# to a non-empty value (as the sbx build's asan and tsan presets do) to drop -Wl,--no-undefined.
include_guard(GLOBAL)

set_property(GLOBAL PROPERTY SBX_PLUGIN_VERSION_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/plugin.version")

function(sbx_add_plugin target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "C" "OUTPUT_DIRECTORY" "SOURCES")
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "sbx_add_plugin(${target}): unknown arguments: ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "sbx_add_plugin(${target}): no SOURCES")
  endif()
  get_property(version_script GLOBAL PROPERTY SBX_PLUGIN_VERSION_SCRIPT)

  add_library(${target} MODULE ${ARG_SOURCES})
  if(ARG_C)
    target_link_libraries(${target} PRIVATE sbx::abi)
    target_compile_features(${target} PRIVATE c_std_11)
  else()
    target_link_libraries(${target} PRIVATE sbx::sdk)
  endif()
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LINK_DEPENDS ${version_script})
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIRECTORY})
  elseif(SBX_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${SBX_PLUGIN_OUTPUT_DIR})
  endif()
  target_link_options(${target} PRIVATE "LINKER:--version-script=${version_script}")
  if("${SBX_SANITIZE}" STREQUAL "")
    target_link_options(${target} PRIVATE "LINKER:--no-undefined")
  endif()
  set_property(GLOBAL APPEND PROPERTY SBX_PLUGIN_TARGETS ${target})
endfunction()
