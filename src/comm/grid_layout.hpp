// The rank arithmetic of the process grid (doc/parallelism.md, doc/architecture.md "Process grid"), kept free of MPI so it
// can be tested for every shape on one process. ProcessGrid builds its communicators from it:
// group_index() is the colour of MPI_Comm_split, Coord::dp (or a world rank) its key.
//
// Axes. world = tp x cp x dp x pp, and expert parallelism is folded inside data parallelism:
// dp = ep x edp, where edp is the expert-data-parallel degree (the data-parallel axis that is
// left once ep is folded out). The grid therefore has five axes, tp, cp, ep, edp, pp.
//
// Order. parallel.order lists "tp", "cp", "ep", "dp", "pp" separated by '-', FIRST = FASTEST
// varying; in it "dp" names the edp axis. A rank's coordinates are its digits in that mixed
// radix. The default "tp-cp-ep-dp-pp" makes consecutive ranks differ in tp first, so a TP
// group lands inside one node.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// Parallel degrees as the deck gives them: dp is the full data-parallel degree and ep divides
// it (edp = dp / ep).
struct GridDegrees {
  int tp = 1, cp = 1, ep = 1, dp = 1, pp = 1;
};

// The five axes of the grid, in the default order (fastest first).
enum class Axis { tp, cp, ep, edp, pp };
inline constexpr int kAxes = 5;

// The groups a rank belongs to, by which axes vary inside one group:
//   tp, cp, pp, ep, edp  that single axis;
//   dp              ep and edp: all data-parallel replicas of the dense parameters;
//   dp_cp           cp, ep and edp: where dense gradients are reduced when cp > 1;
//   model_parallel  tp and pp: the ranks holding the different shards of the dense model, over
//                   which the global gradient norm is summed. cp and dp ranks are excluded
//                   because they hold replicas of the same shards (their gradients are
//                   already reduced), so counting them would count a shard several times;
//   embedding       the ranks at pp stage 0 and stage pp-1 with all other coordinates equal
//                   (tied input/output embeddings are summed over it). A single rank when
//                   pp == 1, and for a rank at a middle stage (1 .. pp-2) just that rank, so
//                   that every kind of group partitions the world.
enum class Group { tp, cp, pp, dp, dp_cp, ep, edp, model_parallel, embedding };
inline constexpr std::array<Group, 9> kAllGroups = {
    Group::tp,       Group::cp, Group::pp,  Group::dp,
    Group::dp_cp,    Group::ep, Group::edp, Group::model_parallel,
    Group::embedding};

const char* to_string(Group g);  // "tp", ..., "dp_cp", "model_parallel", "embedding"
const char* to_string(Axis a);   // "tp", "cp", "ep", "edp", "pp"

class GridLayout {
 public:
  // A rank's place in the grid. tp, cp, ep, edp, pp are its digits. dp is derived, always with
  // ep fastest whatever the order: dp = ep + ep_degree * edp, in 0 .. dp_degree-1. It is the
  // rank's index among the data-parallel replicas (the data shard it reads); used as the key
  // of MPI_Comm_split for Group::dp it makes the communicator's rank equal to it. (Ordering
  // the dp group by world rank gives the same numbering only when ep precedes dp in the order.)
  struct Coord {
    int tp = 0, cp = 0, ep = 0, edp = 0, pp = 0;
    int dp = 0;
  };

  static constexpr const char* kDefaultOrder = "tp-cp-ep-dp-pp";

  // Validates everything (collective tessera::Error with the values seen and what to do): every
  // degree >= 1, tp x cp x dp x pp == world, ep divides dp, order names each axis once.
  GridLayout(const GridDegrees& degrees, std::string_view order, int world);

  // dp for parallel.dp = auto: world / (tp x cp x pp), an error when that does not divide.
  static int infer_dp(int world, int tp, int cp, int pp);

  int world() const { return world_; }
  const GridDegrees& degrees() const { return degrees_; }
  int edp() const { return degrees_.dp / degrees_.ep; }
  int size(Axis a) const { return size_[static_cast<int>(a)]; }
  int stride(Axis a) const { return stride_[static_cast<int>(a)]; }
  const std::array<Axis, kAxes>& order() const { return order_; }  // fastest first
  std::string order_string() const;                                // e.g. "tp-cp-ep-dp-pp"

  Coord coord(int rank) const;
  int rank(const Coord& c) const;  // reads tp, cp, ep, edp, pp; dp is derived and ignored

  // The sorted world ranks of rank's group of kind g (rank included).
  std::vector<int> group(int rank, Group g) const;
  // The number of ranks in a group of kind g (for embedding: that of the end-stage groups).
  int group_size(Group g) const;
  // The partition of the world into groups of kind g: each sorted, the list sorted by first
  // rank.
  std::vector<std::vector<int>> all_groups(Group g) const;
  // Which of all_groups(g) holds rank (computed directly, O(1)): the colour for MPI_Comm_split.
  int group_index(int rank, Group g) const;

  // "tp 2 x cp 1 x dp 4 (ep 2 x edp 2) x pp 2 = 16 ranks, order tp-cp-ep-dp-pp (fastest first)"
  std::string describe() const;

 private:
  // The axes that vary inside a group of kind g (embedding: none; it is handled apart).
  static std::array<bool, kAxes> varying(Group g);
  static std::array<int, kAxes> digits(const Coord& c);

  GridDegrees degrees_;
  int world_ = 1;
  std::array<Axis, kAxes> order_{};
  std::array<int, kAxes> size_{};    // by Axis
  std::array<int, kAxes> stride_{};  // by Axis
};

}  // namespace tessera
