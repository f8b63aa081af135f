# What `cmake --install` puts where, the CMake package, the pkg-config files and the Debian packages
# (`cpack --config <build>/CPackConfig.cmake -B <dir> -G DEB`). docs/packaging.md describes the
# result. Included last by the top-level CMakeLists.txt, when every target exists.
#
# Install components, one Debian package each:
#   runtime -> package sbx         bin/sbx, libexec/sbx/sbx-plugin-probe, lib/sbx/plugins/*.so
#   dev     -> package libsbx-dev  include/sbx/, lib/libsbx_*.a, lib/cmake/sbx/, lib/pkgconfig/,
#                                  share/doc/sbx/
# Tests, benchmarks and the examples are not installed (the sources under share/doc/sbx/ are docs).

# ---- Targets ------------------------------------------------------------------------------------

# The libraries of the kit, each in an export set of its own (sbx-<set>-targets.cmake), so that
# sbx-config.cmake loads, and finds the dependencies of, only what a project asks for: sbx::sdk
# without libcurl. Entries are <target>:<exported name>; the exported name is also the set's name
# and the CMake package component's. sbx::base (helpers shared by the SDK and the host) and
# sbx::sdk_testing (the fake host) are installed when this tree has them.
set(sbx_libraries sbx_abi:abi)
if(TARGET sbx_base)
  list(APPEND sbx_libraries sbx_base:base)
endif()
list(APPEND sbx_libraries sbx_sdk:sdk sbx_sdk_http:sdk_http)
if(TARGET sbx_sdk_testing)
  list(APPEND sbx_libraries sbx_sdk_testing:sdk_testing)
endif()
list(APPEND sbx_libraries sbx_core:core)

set(sbx_library_sets "")
set(sbx_set_needs "")  # for sbx-config.cmake: which other sets each set links
foreach(entry ${sbx_libraries})
  string(REPLACE ":" ";" entry ${entry})
  list(GET entry 0 target)
  list(GET entry 1 name)
  list(APPEND sbx_library_sets ${name})
  set(sbx_set_of_${target} ${name})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  # Include directories name the source tree; an installed target uses <prefix>/include.
  get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
  if(dirs)
    set(relocatable "")
    foreach(dir ${dirs})
      if(dir MATCHES "^\\$<")
        list(APPEND relocatable "${dir}")
      else()
        list(APPEND relocatable "$<BUILD_INTERFACE:${dir}>")
      endif()
    endforeach()
    list(APPEND relocatable "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
    set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${relocatable}")
  endif()
  if(name STREQUAL "abi")
    install(TARGETS ${target} EXPORT sbx-${name})  # header-only: the headers are installed below
  else()
    install(TARGETS ${target} EXPORT sbx-${name}
            ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
  endif()
endforeach()
foreach(entry ${sbx_libraries})
  string(REPLACE ":" ";" entry ${entry})
  list(GET entry 0 target)
  list(GET entry 1 name)
  get_target_property(links ${target} LINK_LIBRARIES)
  get_target_property(interface_links ${target} INTERFACE_LINK_LIBRARIES)
  set(needs "")
  foreach(link ${links} ${interface_links})
    if(TARGET "${link}")
      get_target_property(real "${link}" ALIASED_TARGET)
      if(NOT real)
        set(real "${link}")
      endif()
      if(DEFINED sbx_set_of_${real} AND NOT sbx_set_of_${real} STREQUAL name)
        list(APPEND needs ${sbx_set_of_${real}})
      endif()
    endif()
  endforeach()
  list(REMOVE_DUPLICATES needs)
  string(APPEND sbx_set_needs "set(_sbx_needs_${name} ${needs})\n")
endforeach()

# The executables: sbx::sbx and sbx::plugin_probe in sbx-tools-targets.cmake, always loaded.
set_target_properties(sbx PROPERTIES EXPORT_NAME sbx)
set_target_properties(sbx-plugin-probe PROPERTIES EXPORT_NAME plugin_probe)
install(TARGETS sbx EXPORT sbx-tools RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(TARGETS sbx-plugin-probe EXPORT sbx-tools
        RUNTIME DESTINATION ${SBX_INSTALL_PROBEDIR} COMPONENT runtime)
# Inside this build the executables answer to their exported names too.
add_executable(sbx::sbx ALIAS sbx)
add_executable(sbx::plugin_probe ALIAS sbx-plugin-probe)

# The in-tree plugins: every sbx_add_plugin target defined under plugins/ (not tests/, bench/ or
# sdk/examples/).
get_property(sbx_plugin_targets GLOBAL PROPERTY SBX_PLUGIN_TARGETS)
set(sbx_installed_plugins "")  # their file names without .so, for the sbx package's description
foreach(target ${sbx_plugin_targets})
  get_target_property(dir ${target} SOURCE_DIR)
  file(RELATIVE_PATH relative ${PROJECT_SOURCE_DIR} ${dir})
  if(relative MATCHES "^plugins/")
    install(TARGETS ${target} LIBRARY DESTINATION ${SBX_INSTALL_PLUGINDIR} COMPONENT runtime)
    get_target_property(output_name ${target} OUTPUT_NAME)
    if(NOT output_name)
      set(output_name ${target})
    endif()
    list(APPEND sbx_installed_plugins ${output_name})
  endif()
endforeach()
list(SORT sbx_installed_plugins)

# ---- Headers ------------------------------------------------------------------------------------

install(DIRECTORY sdk/include/ core/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")

# ---- Docs and examples --------------------------------------------------------------------------

# The docs and the example plugins, for an author who has the packages but no source tree. They
# keep the source tree's layout under share/doc/sbx/ (docs/, sdk/examples/), so the links between
# them still resolve and `SBX_SRC=<prefix>/share/doc/sbx` serves the guide's walk-through.
# Every relative link of an installed .md file names an installed path (scripts/kit-test.sh checks
# it): the READMEs the docs link to, directly or through each other, are installed too, and the
# sources the guide cites (the fake host's test, the asynchronous test plugin).
set(sbx_doc_dir ${CMAKE_INSTALL_DATAROOTDIR}/doc/sbx)
install(DIRECTORY docs/ DESTINATION ${sbx_doc_dir}/docs COMPONENT dev
        FILES_MATCHING PATTERN "*.md")
install(DIRECTORY sdk/examples/ DESTINATION ${sbx_doc_dir}/sdk/examples COMPONENT dev)
foreach(readme README.md sdk/README.md sdk/base/README.md core/README.md cli/README.md
               conformance/README.md serve/README.md agent/README.md plugins/README.md
               plugins/local_docker/README.md plugins/opensandbox/README.md python/README.md
               bench/README.md tests/README.md tests/clients/README.md cmake/README.md
               fuzz/README.md
               scripts/README.md)
  cmake_path(GET readme PARENT_PATH folder)
  install(FILES ${readme} DESTINATION ${sbx_doc_dir}/${folder} COMPONENT dev)
endforeach()
install(FILES tests/sdk/fake_host_test.cpp DESTINATION ${sbx_doc_dir}/tests/sdk COMPONENT dev)
install(FILES tests/plugins/test_processes/provider.cpp tests/plugins/test_processes/terminal.hpp
              tests/plugins/test_processes/terminal.cpp
        DESTINATION ${sbx_doc_dir}/tests/plugins/test_processes COMPONENT dev)
# share/doc/sbx/sdk/include: a relative link to the installed headers (include/, where sdk/include/
# and core/include/ are merged), for the docs' links into sdk/include/.
install(CODE "
  set(doc_dir \"${sbx_doc_dir}\")
  set(include_dir \"${CMAKE_INSTALL_INCLUDEDIR}\")
  foreach(var doc_dir include_dir)
    cmake_path(ABSOLUTE_PATH \${var} BASE_DIRECTORY \"\${CMAKE_INSTALL_PREFIX}\")
  endforeach()
  file(RELATIVE_PATH target \"\${doc_dir}/sdk\" \"\${include_dir}\")
  set(link \"\$ENV{DESTDIR}\${doc_dir}/sdk/include\")
  message(STATUS \"Installing: \${link} -> \${target}\")
  file(REMOVE \"\${link}\")
  file(CREATE_LINK \"\${target}\" \"\${link}\" SYMBOLIC)
" COMPONENT dev)

# ---- The CMake package --------------------------------------------------------------------------

foreach(set ${sbx_library_sets} tools)
  install(EXPORT sbx-${set} FILE sbx-${set}-targets.cmake NAMESPACE sbx::
          DESTINATION ${SBX_INSTALL_CMAKEDIR} COMPONENT dev)
endforeach()
include(CMakePackageConfigHelpers)
configure_package_config_file(cmake/sbx-config.cmake.in ${PROJECT_BINARY_DIR}/sbx-config.cmake
  INSTALL_DESTINATION ${SBX_INSTALL_CMAKEDIR}
  PATH_VARS SBX_INSTALL_PLUGINDIR SBX_INSTALL_PROBEDIR)
# The package version is the ABI version (top-level CMakeLists.txt): the same major, and a minor no
# newer than this one, is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sbx-config-version.cmake
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/sbx-config.cmake ${PROJECT_BINARY_DIR}/sbx-config-version.cmake
              sdk/cmake/SbxAddPlugin.cmake sdk/cmake/plugin.version
        DESTINATION ${SBX_INSTALL_CMAKEDIR} COMPONENT dev)

# ---- pkg-config ---------------------------------------------------------------------------------

# Paths relative to the .pc file's own directory (${pcfiledir}), so a moved prefix still works.
set(pc_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
cmake_path(ABSOLUTE_PATH pc_dir BASE_DIRECTORY ${CMAKE_INSTALL_PREFIX} OUTPUT_VARIABLE pc_full_dir)
file(RELATIVE_PATH pc_prefix_from_pcdir ${pc_full_dir} ${CMAKE_INSTALL_PREFIX})
file(RELATIVE_PATH pc_includedir ${CMAKE_INSTALL_PREFIX} ${CMAKE_INSTALL_FULL_INCLUDEDIR})
file(RELATIVE_PATH pc_libdir ${CMAKE_INSTALL_PREFIX} ${CMAKE_INSTALL_FULL_LIBDIR})
file(RELATIVE_PATH pc_plugindir ${CMAKE_INSTALL_PREFIX} ${SBX_INSTALL_FULL_PLUGINDIR})
file(RELATIVE_PATH pc_cmakedir ${CMAKE_INSTALL_PREFIX} ${SBX_INSTALL_FULL_CMAKEDIR})
# The SDK's static libraries, each before the ones it uses.
set(pc_sdk_libs "-lsbx_sdk")
if(TARGET sbx_base)
  string(APPEND pc_sdk_libs " -lsbx_base")
endif()
set(sbx_pc_files sbx sbx-abi sbx-http)
if(TARGET sbx_sdk_testing)  # sbx-testing.pc: the fake host, with what it links beyond sbx.pc
  list(APPEND sbx_pc_files sbx-testing)
  set(pc_testing_libs "")
  foreach(lib ${CMAKE_DL_LIBS})
    string(APPEND pc_testing_libs " -l${lib}")
  endforeach()
  string(STRIP "${pc_testing_libs}" pc_testing_libs)
endif()
foreach(pc ${sbx_pc_files})
  configure_file(cmake/${pc}.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/${pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/${pc}.pc DESTINATION ${pc_dir} COMPONENT dev)
endforeach()

# ---- Debian packages: cpack --config <build>/CPackConfig.cmake -B <dir> -G DEB -------------------

set(CPACK_PACKAGE_NAME sbx)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
# Empty, so that CPackDeb takes each package's summary from the first line of its own description
# (CPACK_DEBIAN_<COMPONENT>_DESCRIPTION) instead of putting the project's above both.
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "")
set(CPACK_PACKAGE_CONTACT "sbx maintainers <sbx-maintainers@example.invalid>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL runtime dev)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # <name>_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME sbx)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)  # Depends from dpkg-shlibdeps (package dpkg-dev)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "docker.io")
# A package description: the summary, then `text` wrapped at 80 columns (CPackDeb indents each
# line of it by one space).
function(sbx_deb_description var summary text)
  set(lines "")
  set(line "")
  string(REPLACE " " ";" words "${text}")
  foreach(word ${words})
    string(LENGTH "${line} ${word}" width)
    if(line STREQUAL "")
      set(line "${word}")
    elseif(width GREATER 79)
      string(APPEND lines "${line}\n")
      set(line "${word}")
    else()
      string(APPEND line " ${word}")
    endif()
  endforeach()
  set(${var} "${summary}\n${lines}${line}" PARENT_SCOPE)
endfunction()

# The description names every plugin the package ships (scripts/kit-test.sh checks it against the
# package's lib/sbx/plugins/*.so), each with its line below when it has one.
set(sbx_plugin_summary_local_docker "sandboxes as containers of the local Docker daemon")
set(sbx_plugin_summary_opensandbox "a client of an OpenSandbox server's lifecycle and execd APIs")
list(LENGTH sbx_installed_plugins count)
set(text "The sbx command, its plugin probe and ${count} provider plugins:")
foreach(plugin ${sbx_installed_plugins})
  string(APPEND text " ${plugin}")
  if(DEFINED sbx_plugin_summary_${plugin})
    string(APPEND text " (${sbx_plugin_summary_${plugin}})")
  endif()
  string(APPEND text ",")
endforeach()
string(REGEX REPLACE ",$" "." text "${text}")
sbx_deb_description(CPACK_DEBIAN_RUNTIME_DESCRIPTION
                    "run commands in sandboxes through provider plugins" "${text}")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libsbx-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# The exact sbx: the CMake package's sbx::sbx and sbx::plugin_probe are its files, and a plugin
# author tests with its `sbx conformance`. Boost.JSON for sbx::sdk; libcurl only for sbx::sdk_http
# and spdlog only for sbx::core, hence recommended, not required.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "sbx (= ${PROJECT_VERSION}), libboost-json1.81-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS
    "libcurl4-openssl-dev | libcurl-dev, libspdlog-dev, cmake (>= 3.25) | pkg-config")
string(REPLACE ";" ", " pc_list "${sbx_pc_files}")
sbx_deb_description(CPACK_DEBIAN_DEV_DESCRIPTION
  "sbx provider plugin SDK and host library (development files)"
  "The C ABI headers, the C++20 plugin SDK, its HTTP client and its fake host for a plugin's \
unit tests, the host library, as static libraries with a CMake package (find_package(sbx)) and \
pkg-config files (${pc_list}), and the docs and the example plugins.")

# What only the packages have (cmake/deb-docs.cmake, run by cpack before it builds them): sbx's
# /usr/share/doc/sbx/copyright, and libsbx-dev's /usr/share/doc/libsbx-dev, a link to sbx.
set(CPACK_PRE_BUILD_SCRIPTS ${PROJECT_SOURCE_DIR}/cmake/deb-docs.cmake)
set(CPACK_SBX_COPYRIGHT_FILE ${PROJECT_SOURCE_DIR}/cmake/copyright)
set(CPACK_SBX_DOCDIR ${CMAKE_INSTALL_DATAROOTDIR}/doc)

if(sbx_IS_TOP_LEVEL)  # a project that adds sbx as a subdirectory keeps its own packaging
  include(CPack)
endif()
