// Turning a fault that only some ranks saw into one every rank raises: each rank says whether
// it is fine; if any is not, every rank throws a collective Error carrying the message of the
// lowest failing rank. Use where ranks read different parts of a file.
#pragma once

#include <string>

#include "comm/communicator.hpp"

namespace tessera {

void agree_or_throw(Communicator& comm, bool ok, const std::string& message);

// Runs body; a tessera::Error or std::exception it throws on any rank becomes a collective
// Error on all ranks (the lowest failing rank's message).
template <class Body>
void collectively(Communicator& comm, Body&& body) {
  bool ok = true;
  std::string message;
  try {
    body();
  } catch (const std::exception& e) {
    ok = false;
    message = e.what();
  }
  agree_or_throw(comm, ok, message);
}

}  // namespace tessera
