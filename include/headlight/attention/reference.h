// The reference attention: the specification every faster kernel is tested against.
//
// Plain loops over (batch, query head, query row, key row) with double accumulation, exactly the
// formulas documented in params.h. Slow by design; readable first.
#pragma once

#include "headlight/attention/params.h"

namespace headlight::attention::reference {

// Writes p.out, and p.lse and p.probs when they are non-null.
void forward(const AttentionParams& p);

// Writes p.dq, p.dk and p.dv (overwriting them) from p.q, p.k, p.v and p.dout, recomputing the
// probabilities from scratch (the saved output and lse are not needed).
void backward(const AttentionParams& p);

}  // namespace headlight::attention::reference
