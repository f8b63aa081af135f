/* Built into v1_0_processes beside the C example (tests/plugins/CMakeLists.txt), with the same
 * include path: the build fails unless the ABI headers found there are the frozen 1.0 ones. */
#include <sbx/abi/version.h>

#if SBX_ABI_VERSION_MAJOR != 1 || SBX_ABI_VERSION_MINOR != 0
#error "v1_0_processes must be built against the ABI 1.0 headers (-I tests/abi/v1_0) only"
#endif

typedef int sbx_v1_0_processes_headers_are_1_0; /* a translation unit may not be empty */
