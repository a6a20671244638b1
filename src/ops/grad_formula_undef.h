/* grad_formula_undef.h - ends one reading of needle_ops.h's backward
 * formulas (op_elementwise.c reads them twice: as tensor ops, and as the
 * steps of a fused elementwise program): undefines the formula macros and
 * SAVED_*, so the next reading defines its own. No include guard: it is
 * meant to be included once per reading. */
#undef ND_X
#undef SAVED_NONE
#undef SAVED_INPUT
#undef SAVED_OUTPUT
#undef MUL
#undef DIV
#undef ADD
#undef SUB
#undef MULS
#undef ADDS
#undef POWS
#undef GTS
#undef RSUBS
#undef UN
#undef ZEROS
