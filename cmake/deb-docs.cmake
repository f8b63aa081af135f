# CPack pre-build script for the Debian packages (CPACK_PRE_BUILD_SCRIPTS, cmake/install.cmake): run
# by cpack after it installed each component into its staging directory, before it builds the
# .deb files. What only a Debian package has, not an install into a prefix (docs/packaging.md):
#   - sbx (component runtime): /usr/share/doc/sbx/copyright, a Debian-format copyright file;
#   - libsbx-dev (component dev): /usr/share/doc/libsbx-dev, a link to sbx, where its own docs are
#     (share/doc/sbx/, the layout the guide names). Debian policy 12.3 allows the link for packages
#     of one source, the first depending on the second (libsbx-dev: sbx (= version)); the
#     copyright file is then sbx's (12.5).
set(runtime_root "${CPACK_TEMPORARY_DIRECTORY}/runtime${CPACK_PACKAGING_INSTALL_PREFIX}")
set(dev_root "${CPACK_TEMPORARY_DIRECTORY}/dev${CPACK_PACKAGING_INSTALL_PREFIX}")
foreach(dir runtime_root dev_root)
  if(NOT IS_DIRECTORY "${${dir}}")
    message(FATAL_ERROR "deb-docs.cmake: no staging directory ${${dir}}")
  endif()
endforeach()
set(runtime_doc "${runtime_root}/${CPACK_SBX_DOCDIR}/${CPACK_DEBIAN_RUNTIME_PACKAGE_NAME}")
file(COPY "${CPACK_SBX_COPYRIGHT_FILE}" DESTINATION "${runtime_doc}"  # not file(INSTALL): no DESTDIR
     FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
set(dev_doc "${dev_root}/${CPACK_SBX_DOCDIR}/${CPACK_DEBIAN_DEV_PACKAGE_NAME}")
file(MAKE_DIRECTORY "${dev_root}/${CPACK_SBX_DOCDIR}")
file(REMOVE "${dev_doc}")  # from an earlier run into the same staging directory
file(CREATE_LINK "${CPACK_DEBIAN_RUNTIME_PACKAGE_NAME}" "${dev_doc}" SYMBOLIC)
