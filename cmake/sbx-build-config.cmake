# The sbx CMake package inside the sbx build. The top-level CMakeLists.txt copies this file to
# CMAKE_FIND_PACKAGE_REDIRECTS_DIR, where find_package(sbx) looks before anywhere else, so that a
# project of this build (sdk/examples/*) finds this build's targets, not an installed sbx, with the
# same find_package(sbx 1.2 CONFIG REQUIRED COMPONENTS ...) it uses against an install. The
# version file next to it is written by write_basic_package_version_file, as for the install.
# sbx_add_plugin() is already defined (sdk/cmake/SbxAddPlugin.cmake). Only targets defined before
# the find_package call are found: sdk/ comes first, core/ after the examples.
set(_sbx_components ${sbx_FIND_COMPONENTS})
if(NOT _sbx_components)
  set(_sbx_components sdk)
endif()
foreach(_sbx_component IN LISTS _sbx_components)
  if(TARGET sbx::${_sbx_component})
    set(sbx_${_sbx_component}_FOUND TRUE)
  else()
    set(sbx_${_sbx_component}_FOUND FALSE)
    if(sbx_FIND_REQUIRED_${_sbx_component})
      set(sbx_FOUND FALSE)
      set(sbx_NOT_FOUND_MESSAGE
          "component '${_sbx_component}': no target sbx::${_sbx_component} in this build (yet)")
    endif()
  endif()
endforeach()
unset(_sbx_component)
unset(_sbx_components)
