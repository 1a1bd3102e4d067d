#include "comm/agree.hpp"

#include <vector>

#include "core/error.hpp"

namespace tessera {

void agree_or_throw(Communicator& comm, bool ok, const std::string& message) {
  // Lowest failing rank, or size() when every rank is fine.
  int64_t first_bad = ok ? comm.size() : comm.rank();
  comm.all_reduce(&first_bad, 1, ReduceOp::min);
  if (first_bad == comm.size()) return;
  int64_t length = comm.rank() == first_bad ? int64_t(message.size()) : 0;
  comm.broadcast(&length, sizeof length, int(first_bad));
  std::vector<char> text(static_cast<size_t>(length), '\0');
  if (comm.rank() == first_bad) text.assign(message.begin(), message.end());
  comm.broadcast(text.data(), length, int(first_bad));
  throw Error(std::string(text.begin(), text.end()), __FILE__, __LINE__, true);
}

}  // namespace tessera
