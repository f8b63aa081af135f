// The sbx host API: load provider plugins, create sandboxes, run commands, move files.
#pragma once

#include <sbx/core/config.hpp>
#include <sbx/core/errors.hpp>
#include <sbx/core/host.hpp>
#include <sbx/core/operation.hpp>
#include <sbx/core/provider.hpp>
#include <sbx/core/sandbox.hpp>
#include <sbx/core/spec.hpp>
