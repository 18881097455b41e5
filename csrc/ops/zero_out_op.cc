// Op definition: ZeroOut(to_zero: T) -> zeroed: T, same shape; the first element in flat order is kept,
// every other element is zero. A 0-d input is returned unchanged; an empty input gives an empty output.
#include "common/op_names.h"
#include "common/shape_fns.h"
#include "common/tfc.h"

static const tfmo::OnLoad kRegister([] {
  tfmo::DefineOp(TFMO_OP_ZERO_OUT, {"T: {int32, int64, float, half}"}, {"to_zero: T"}, {"zeroed: T"},
                 &tfmo::UnchangedShape);
});
