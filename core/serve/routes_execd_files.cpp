// The execd file routes on the gateway (phase 2).

#include "state.hpp"

namespace sbx::serve {

bool route_execd_files(const std::shared_ptr<Server::State>&, const std::shared_ptr<Entry>&,
                       const ExecdTarget&, const Request&, const Reply&, const OpenStream&) {
  return false;
}

bool is_execd_upload(const Request&) {
  return false;
}

std::shared_ptr<BodySink> open_execd_upload(const std::shared_ptr<Server::State>&, const Request&,
                                            const Reply&) {
  return nullptr;
}

}  // namespace sbx::serve
