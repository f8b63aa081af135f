/* The sbx provider ABI: everything a plugin and a host share. Stable headers only; extensions are
 * included separately from sbx/abi/ext/. Start with docs/abi/README.md. */
#ifndef SBX_ABI_H
#define SBX_ABI_H

#include "abi/entry.h"
#include "abi/host.h"
#include "abi/provider.h"
#include "abi/spec.h"
#include "abi/types.h"
#include "abi/version.h"

#endif /* SBX_ABI_H */
