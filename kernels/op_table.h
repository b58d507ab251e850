// The machinery behind the op table (kernels/op_table.def): what turns each LT_OP entry into a
// declaration, a dispatch function or a backend's entry point. A reader of the ops needs only the
// table; this file matters to whoever adds a new use of it.
//
// How it works: an entry is LT_OP(return type, name, elements...), and the table's notation
// (READ, WRITE, UPDATE, ..., ARG, REQUIRE; defined at the top of op_table.def) turns every element
// into a tuple whose first word says its kind:
//
//   (tensor, name, use, class, need, count)   a tensor operand
//   (arg, type, name)                          a plain argument
//   (require, condition)                       a precondition the dispatch checks
//
// A file that includes the table defines LT_OP first and applies one of the forms below to the
// elements (LT_OP_FOR_EACH visits them in order):
//
//   #define LT_OP(ret, name, ...) ret name(LT_OP_PARAMS(__VA_ARGS__));
//   #include "kernels/op_table.def"
//   #undef LT_OP
//
// The rule a reader could get wrong: the elements are expanded once per form, so a count or a
// condition is an expression over the op's parameters that is only ever evaluated inside the
// dispatch function (kernels/dispatch.cpp, where numel/rows/cols/kAny are defined); the
// declarations drop them unevaluated.
#pragma once

// LT_OP_FOR_EACH(m, a, b, ...) is `m a m b ...`: each element is a parenthesized tuple, so `m a`
// is a call. Up to 64 elements (C++20 __VA_OPT__ recursion, one rescan level per element).
#define LT_OP_PARENS ()
#define LT_OP_EXPAND(...) LT_OP_EXPAND3(LT_OP_EXPAND3(LT_OP_EXPAND3(LT_OP_EXPAND3(__VA_ARGS__))))
#define LT_OP_EXPAND3(...) LT_OP_EXPAND2(LT_OP_EXPAND2(LT_OP_EXPAND2(LT_OP_EXPAND2(__VA_ARGS__))))
#define LT_OP_EXPAND2(...) LT_OP_EXPAND1(LT_OP_EXPAND1(LT_OP_EXPAND1(LT_OP_EXPAND1(__VA_ARGS__))))
#define LT_OP_EXPAND1(...) __VA_ARGS__
#define LT_OP_FOR_EACH(m, ...) __VA_OPT__(LT_OP_EXPAND(LT_OP_FOR_EACH_STEP(m, __VA_ARGS__)))
#define LT_OP_FOR_EACH_STEP(m, x, ...) m x __VA_OPT__(LT_OP_FOR_EACH_AGAIN LT_OP_PARENS(m, __VA_ARGS__))
#define LT_OP_FOR_EACH_AGAIN() LT_OP_FOR_EACH_STEP

#define LT_OP_DROP_FIRST(...) LT_OP_DROP_FIRST_(__VA_ARGS__)
#define LT_OP_DROP_FIRST_(first, ...) __VA_ARGS__

// The parameter list: `Tensor out, Tensor in, float eps`.
#define LT_OP_PARAMS(...) LT_OP_DROP_FIRST(LT_OP_FOR_EACH(LT_OP_PARAM, __VA_ARGS__))
#define LT_OP_PARAM(kind, ...) LT_OP_PARAM_##kind(__VA_ARGS__)
#define LT_OP_PARAM_tensor(name, ...) , ::llmtrain::kernels::Tensor name
#define LT_OP_PARAM_arg(type, name) , type name
#define LT_OP_PARAM_require(...)

// The argument list of a call with the same names: `out, in, eps`.
#define LT_OP_ARGS(...) LT_OP_DROP_FIRST(LT_OP_FOR_EACH(LT_OP_ARG, __VA_ARGS__))
#define LT_OP_ARG(kind, ...) LT_OP_ARG_##kind(__VA_ARGS__)
#define LT_OP_ARG_tensor(name, ...) , name
#define LT_OP_ARG_arg(type, name) , name
#define LT_OP_ARG_require(...)

// The tensor operands as initializers of kernels/dispatch.cpp's Operand: `{"out", &out, ...},`.
#define LT_OP_OPERANDS(...) LT_OP_FOR_EACH(LT_OP_OPERAND, __VA_ARGS__)
#define LT_OP_OPERAND(kind, ...) LT_OP_OPERAND_##kind(__VA_ARGS__)
#define LT_OP_OPERAND_tensor(name, use, cls, need, count) {#name, &name, Use::use, Class::cls, Need::need, (count)},
#define LT_OP_OPERAND_arg(...)
#define LT_OP_OPERAND_require(...)

// The preconditions as statements: `LT_CHECK(cond, ...);` with `op` the op's name in scope.
#define LT_OP_REQUIRES(...) LT_OP_FOR_EACH(LT_OP_REQUIRE, __VA_ARGS__)
#define LT_OP_REQUIRE(kind, ...) LT_OP_REQUIRE_##kind(__VA_ARGS__)
#define LT_OP_REQUIRE_tensor(...)
#define LT_OP_REQUIRE_arg(...)
#define LT_OP_REQUIRE_require(cond) LT_CHECK(cond, "{}: `{}` does not hold", op, #cond);

// Declares every op of the table with the table's signature (ops.h; each backend's namespace).
#define LT_OP_DECLARE(ret, name, ...) ret name(LT_OP_PARAMS(__VA_ARGS__));
