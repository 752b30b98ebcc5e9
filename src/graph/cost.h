// What a node must do at least, whatever backend runs it: the bytes it moves (its weights read
// once, its inputs read and outputs written once, the states it reads and updates) and the
// arithmetic it does (a multiply-add counts two). The yardstick a device profile holds its times
// against (graph/backend.h DeviceProfile): bytes over time is the bandwidth it reached, FLOPs
// over time its rate of computation.
#pragma once

#include <cstdint>

#include "graph/plan.h"

namespace qhx {

struct NodeCost {
  double bytes = 0, flops = 0;
  NodeCost& operator+=(const NodeCost& o) {
    bytes += o.bytes;
    flops += o.flops;
    return *this;
  }
};

// The node's cost when its rows start at position `first_pos` of the sequence (attention reads
// the keys before them). The delta rule counts its recurrent form's arithmetic (the chunked form
// a prompt runs does more, in matrix products); a conversion of weights on the fly (a W4 row into
// its values) counts nothing.
NodeCost node_cost(const Plan& plan, const Node& node, int64_t first_pos);

}  // namespace qhx
