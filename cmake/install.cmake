# What `cmake --install` puts where, the CMake package, the pkg-config files and the Debian packages
# (`cpack -G DEB`). docs/packaging.md describes the result. Included last by the top-level
# CMakeLists.txt, when every target exists.
#
# Install components, one Debian package each:
#   runtime -> package sbx         bin/sbx, libexec/sbx/sbx-plugin-probe, lib/sbx/plugins/*.so
#   dev     -> package libsbx-dev  include/sbx/, lib/libsbx_*.a, lib/cmake/sbx/, lib/pkgconfig/
# Tests, benchmarks and the examples are not installed.

# ---- Targets ------------------------------------------------------------------------------------

# One export set per CMake package component, so that sbx-config.cmake loads (and finds the
# dependencies of) only the components asked for: sbx::sdk without libcurl.
set(sbx_exported
  sbx_abi:abi:abi
  sbx_sdk:sdk:sdk
  sbx_sdk_http:sdk_http:sdk_http
  sbx_core:core:core
  sbx:sbx:tools
  sbx-plugin-probe:plugin_probe:tools)
foreach(entry ${sbx_exported})
  string(REPLACE ":" ";" entry ${entry})
  list(GET entry 0 target)
  list(GET entry 1 name)
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
endforeach()

# Inside this build the executables answer to their exported names too.
add_executable(sbx::sbx ALIAS sbx)
add_executable(sbx::plugin_probe ALIAS sbx-plugin-probe)

install(TARGETS sbx_abi EXPORT sbx-abi)
install(TARGETS sbx_sdk EXPORT sbx-sdk ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(TARGETS sbx_sdk_http EXPORT sbx-sdk_http
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(TARGETS sbx_core EXPORT sbx-core ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(TARGETS sbx EXPORT sbx-tools RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
install(TARGETS sbx-plugin-probe EXPORT sbx-tools
        RUNTIME DESTINATION ${SBX_INSTALL_PROBEDIR} COMPONENT runtime)

# The in-tree plugins: every sbx_add_plugin target defined under plugins/ (not tests/, bench/ or
# sdk/examples/).
get_property(sbx_plugin_targets GLOBAL PROPERTY SBX_PLUGIN_TARGETS)
foreach(target ${sbx_plugin_targets})
  get_target_property(dir ${target} SOURCE_DIR)
  file(RELATIVE_PATH relative ${PROJECT_SOURCE_DIR} ${dir})
  if(relative MATCHES "^plugins/")
    install(TARGETS ${target} LIBRARY DESTINATION ${SBX_INSTALL_PLUGINDIR} COMPONENT runtime)
  endif()
endforeach()

# ---- Headers ------------------------------------------------------------------------------------

install(DIRECTORY sdk/include/ core/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp")

# ---- The CMake package --------------------------------------------------------------------------

foreach(set abi sdk sdk_http core tools)
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
foreach(pc sbx sbx-abi sbx-http)
  configure_file(cmake/${pc}.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/${pc}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/${pc}.pc DESTINATION ${pc_dir} COMPONENT dev)
endforeach()

# ---- Debian packages: cpack -G DEB (in the build directory) --------------------------------------

set(CPACK_PACKAGE_NAME sbx)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
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
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
    "run commands in sandboxes through provider plugins\n\
The sbx command, its plugin probe and the local_docker provider plugin (sandboxes as\n\
containers of the local Docker daemon).")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libsbx-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# The exact sbx: the CMake package's sbx::sbx and sbx::plugin_probe are its files, and a plugin
# author tests with its `sbx conformance`. Boost.JSON for sbx::sdk; libcurl only for sbx::sdk_http
# and spdlog only for sbx::core, hence recommended, not required.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "sbx (= ${PROJECT_VERSION}), libboost-json1.81-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_RECOMMENDS
    "libcurl4-openssl-dev | libcurl-dev, libspdlog-dev, cmake (>= 3.25) | pkg-config")
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "sbx provider plugin SDK and host library (development files)\n\
The C ABI headers, the C++20 plugin SDK and its HTTP client, the host library, as static\n\
libraries with a CMake package (find_package(sbx)) and pkg-config files (sbx, sbx-abi,\n\
sbx-http).")

if(sbx_IS_TOP_LEVEL)  # a project that adds sbx as a subdirectory keeps its own packaging
  include(CPack)
endif()
