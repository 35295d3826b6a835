"""The kernel language's names: every module, member, builtin and attribute a bundle may use.

Default-deny: a name is allowed because it is listed here, never because no rule names it. The
lists are literal (nothing is imported to decide), so a verdict does not depend on what the
scanning host has installed; tests check that each listed name exists in the pinned torch and
Triton, and that no listed attribute name reaches, on an allowed module, a member the module's own
list refuses. Widening a list is a reviewed change: say in the commit what the name can do.
"""

from __future__ import annotations


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


#: the modules a kernel may import or reach by attribute (``import torch.nn.functional as F``)
MODULES = frozenset({
    "torch", "torch.nn", "torch.nn.functional", "torch.linalg", "torch.special", "torch.cuda",
    "torch.cuda.nvtx", "torch.cpu", "torch.distributed", "triton", "triton.language", "triton.language.math",
    "triton.language.extra", "triton.language.extra.cuda", "triton.language.extra.libdevice", "math", "typing",
    "__future__",
})  # fmt: skip

_TORCH_DTYPES = _names("""
    bfloat16 bool complex64 double float float16 float32 float64 float8_e4m3fn float8_e4m3fnuz float8_e5m2
    float8_e5m2fnuz half int int16 int32 int64 int8 long short uint16 uint32 uint64 uint8
""")

#: module -> the members it allows (a listed module missing here allows only its listed submodules)
MEMBERS: dict[str, frozenset[str]] = {
    "torch": _TORCH_DTYPES | _names("""
        Size Tensor device dtype finfo iinfo no_grad
        abs_ absolute addmv as_strided_ ceil_ clamp_ clamp_max_ clamp_min_ clip_ detach detach_ erf_ exp_ fill_
        float_power floor_ get_device histogram index_put_ is_signed layout log_ nan_to_num_ neg_ ravel
        reciprocal_ relu_ round_ rsqrt_ sigmoid_ sqrt_ tanh_ wait zero_
        abs acos add addcdiv addcmul addmm all allclose amax amin aminmax any arange argmax argmin argsort
        argwhere as_strided as_tensor asin atan atan2 baddbmm bincount bitwise_and bitwise_left_shift
        bitwise_not bitwise_or bitwise_right_shift bitwise_xor bmm broadcast_tensors broadcast_to bucketize
        cat ceil chunk clamp clamp_max clamp_min clip clone concat concatenate cos cosh count_nonzero cummax
        cummin cumprod cumsum diag diagonal diff div divide dot einsum empty empty_like empty_strided eq equal
        erf erfc erfinv exp exp2 expm1 eye flatten flip floor floor_divide fmod frac full full_like gather ge
        gt hstack index_add index_copy index_fill index_put index_select is_complex is_floating_point
        is_tensor isclose isfinite isinf isnan le lerp linspace log log10 log1p log2 log_softmax logaddexp
        logical_and logical_not logical_or logical_xor logsumexp lt masked_fill masked_scatter masked_select
        matmul max maximum mean median min minimum mm movedim mul multiply mv nan_to_num nanmean nansum
        narrow ne neg nonzero norm numel ones ones_like outer permute pow prod promote_types reciprocal
        relu remainder repeat_interleave reshape result_type roll round rsqrt scatter scatter_add
        scatter_reduce searchsorted select sigmoid sign sin sinh softmax sort split sqrt square squeeze
        stack std std_mean sub subtract sum swapaxes t take take_along_dim tanh tensor tensor_split
        tensordot tile topk transpose tril triu true_divide trunc unbind unflatten unique unique_consecutive
        unsqueeze var var_mean view_as_complex view_as_real vstack where zeros zeros_like
    """),
    "torch.nn": _names("functional"),
    "torch.nn.functional": _names("""
        celu cosine_similarity elu embedding gelu glu group_norm hardsigmoid hardswish hardtanh layer_norm
        leaky_relu linear log_softmax logsigmoid mish normalize one_hot pad relu relu6 relu_ rms_norm
        scaled_dot_product_attention selu sigmoid silu softmax softmin softplus softsign tanh threshold
    """),
    "torch.linalg": _names("cross diagonal matmul matrix_norm norm vecdot vector_norm"),
    "torch.special": _names("""
        erf erfc erfcx erfinv exp2 expit expm1 log1p log_softmax logit logsumexp ndtr round sinc softmax xlogy
    """),
    "torch.cuda": _names("""
        Event Stream cast current_device current_stream default_stream device_count get_device_capability
        device get_device_name get_device_properties is_available is_current_stream_capturing stream synchronize
    """),
    "torch.cpu": _names("synchronize"),  # reachable as a value through Tensor.cpu's name
    "torch.cuda.nvtx": _names("mark range range_pop range_push"),
    # the collective calls on the group the harness hands in; nothing that makes, joins or ends a group
    "torch.distributed": _names("""
        P2POp ReduceOp all_gather all_gather_into_tensor all_reduce all_to_all all_to_all_single barrier
        batch_isend_irecv broadcast gather get_rank get_world_size irecv isend recv reduce reduce_scatter
        reduce_scatter_tensor scatter send
    """),
    "torch.distributed.ReduceOp": _names("AVG BAND BOR BXOR MAX MIN PRODUCT SUM"),
    "triton": _names("Config autotune cdiv heuristics jit next_power_of_2"),
    "triton.language": _names("""
        PropagateNan TRITON_MAX_TENSOR_NUMEL abs add arange argmax argmin associative_scan assume
        atomic_add atomic_and atomic_cas atomic_max atomic_min atomic_or atomic_xchg atomic_xor bfloat16
        block_type broadcast broadcast_to cast cat cdiv ceil clamp const constexpr cos cumprod cumsum
        debug_barrier device_assert device_print div_rn dot dot_scaled dtype erf exp exp2 expand_dims fdiv
        flip float16 float32 float64 float8e4b15 float8e4b8 float8e4nv float8e5 float8e5b16 floor fma full
        gather histogram inline_asm_elementwise int1 int16 int32 int64 int8 interleave join load
        load_tensor_descriptor log log2 make_block_ptr make_tensor_descriptor max max_constancy
        max_contiguous maximum min minimum mul multiple_of num_programs pair_uniform_to_normal permute philox
        pi32_t pointer_type program_id rand rand4x randint randint4x randn randn4x range ravel reduce reduce_or
        reshape rsqrt sigmoid sin softmax sort split sqrt sqrt_rn squeeze static_assert static_print
        static_range store store_tensor_descriptor sub sum swizzle2d tensor topk trans uint16 uint32 uint64
        uint8 uint_to_uniform_float umulhi unsqueeze view void where xor_sum zeros zeros_like
    """),
    "triton.language.math": _names("""
        T abs ceil cos div_rn erf exp exp2 fdiv floor fma log log2 rsqrt sin sqrt sqrt_rn umulhi
    """),
    "triton.language.extra.libdevice": _names("""
        abs acos asin atan atan2 cbrt ceil copysign cos cosh div_rn erf erfc erfinv exp exp10 exp2 expm1
        fast_expf fast_logf fast_tanhf float_as_int floor fma fmod hypot int_as_float isinf isnan lgamma
        llrint log log10 log1p log2 nearbyint pow remainder rint round rsqrt signbit sin sinh sqrt sqrt_rn tan tanh
        tgamma
        trunc
    """),
    "math": _names("""
        acos acosh asin asinh atan atan2 atanh cbrt ceil comb copysign cos cosh e erf erfc exp exp2 expm1
        fabs floor fmod gcd hypot inf isclose isfinite isinf isnan isqrt lcm ldexp lgamma log log10 log1p
        log2 nan pi pow prod remainder sin sinh sqrt tan tanh tau trunc
    """),
    # annotation names only; nothing of typing that evaluates or re-exports
    "typing": _names("Any Dict List Optional Sequence T Tuple Union cast"),
    "__future__": _names("annotations"),
}

#: decorators a bundle may put on its own top-level functions
DECORATORS = frozenset({"triton.jit", "triton.autotune", "triton.heuristics"})
JIT = "triton.jit"

#: builtins a bundle may name; any other builtin (getattr, type, vars, open, eval, super...) is refused
BUILTINS = _names("""
    abs all any bool dict divmod enumerate float frozenset int isinstance len list max min pow print range
    reversed round set slice sorted str sum tuple zip
    ArithmeticError AssertionError Exception GeneratorExit IndexError KeyError KeyboardInterrupt LookupError
    NotImplementedError OverflowError RuntimeError StopIteration SystemExit TypeError ValueError
    ZeroDivisionError
""")
#: builtin names an annotation may use
ANNOTATION_BUILTINS = _names("bool dict float frozenset int list set slice str tuple")
#: builtins Triton compiles inside a ``@triton.jit`` body
JIT_BUILTINS = _names("abs bool float int len max min range")

# Tensor methods and attributes. Left out on purpose: autograd (backward, grad, grad_fn,
# register_hook, retain_grad, requires_grad_), host escapes (numpy, storage, untyped_storage,
# share_memory_, pin_memory, to_dlpack), Python callbacks (apply_, map_, map2_), the default
# generator (random_, uniform_, normal_, bernoulli_, exponential_, cauchy_, log_normal_,
# geometric_, multinomial), class changes (as_subclass) and the legacy ``new``.
TENSOR_ATTRS = _names("""
    H T abs abs_ absolute acos add add_ addcdiv addcdiv_ addcmul addcmul_ addmm addmm_ addmv all allclose
    amax amin aminmax any argmax argmin argsort argwhere as_strided as_strided_ atan2 baddbmm baddbmm_
    bfloat16 bincount bitwise_and bitwise_and_ bitwise_left_shift bitwise_not bitwise_or bitwise_or_
    bitwise_right_shift bitwise_xor bmm bool broadcast_to byte ceil ceil_ char chunk clamp clamp_ clamp_max
    clamp_max_ clamp_min clamp_min_ clip clip_ clone contiguous copy_ cos cosh count_nonzero cpu cuda
    cummax cummin cumprod cumsum cumsum_ data_ptr detach detach_ device diag diagonal diff dim dim_order
    div div_ divide dot double dtype element_size eq eq_ equal erf erf_ erfinv exp exp2 exp_ expand
    expand_as expm1 fill_ fill_diagonal_ flatten flip float float_power floor floor_ floor_divide fmod
    frac gather ge get_device gt half index_add index_add_ index_copy index_copy_ index_fill index_fill_
    index_put index_put_ index_select int is_complex is_contiguous is_cpu is_cuda is_floating_point
    is_meta is_set_to is_signed isclose isfinite isinf isnan item itemsize layout le lerp lerp_ log log10
    log1p log2 log_ log_softmax logical_and logical_not logical_or logical_xor logsumexp long lt mH mT
    masked_fill masked_fill_ masked_scatter masked_scatter_ masked_select matmul max maximum mean median
    min minimum mm movedim mul mul_ multiply mv nan_to_num nan_to_num_ nanmean nansum narrow nbytes ndim
    ne neg neg_ new_empty new_full new_ones new_tensor new_zeros nonzero norm numel outer permute pow pow_
    prod reciprocal reciprocal_ record_stream relu relu_ remainder repeat repeat_interleave reshape
    reshape_as resize_ roll round round_ rsqrt rsqrt_ scatter scatter_ scatter_add scatter_add_
    scatter_reduce scatter_reduce_ select set_ shape short sigmoid sigmoid_ sign sin size softmax sort
    split sqrt sqrt_ square squeeze squeeze_ std storage_offset stride sub sub_ subtract sum swapaxes t
    take take_along_dim tanh tanh_ tensor_split tile to tolist topk transpose transpose_ tril tril_ triu
    triu_ true_divide trunc type type_as unbind unflatten unique unique_consecutive unsqueeze unsqueeze_
    values var view view_as where zero_
""")
# What the other values a kernel holds expose: dtypes, devices, finfo, Size, streams and events,
# device properties, topk/sort results, async collective handles, the harness's group, dict/list.
OBJECT_ATTRS = _names("""
    is_floating_point is_signed itemsize to_real to_complex type index bits eps tiny smallest_normal
    resolution count synchronize wait_stream wait_event record_event query elapsed_time record wait
    name major minor multi_processor_count total_memory indices is_completed rank
    get items keys setdefault pop append extend insert
""")
#: attributes an untracked value (a parameter, a call's result) may have read
VALUE_ATTRS = TENSOR_ATTRS | OBJECT_ATTRS
#: attributes of values inside a ``@triton.jit`` body: ``triton.language.tensor``'s and its dtype's
JIT_ATTRS = _names("""
    T abs advance argmax argmin associative_scan atomic_add atomic_and atomic_cas atomic_max atomic_min
    atomic_or atomic_xchg atomic_xor broadcast_to cast cdiv ceil cos cumprod cumsum erf exp exp2
    expand_dims flip floor gather histogram item log log2 logical_and logical_or max min permute ravel
    reduce reduce_or reshape rsqrt sigmoid sin softmax sort split sqrt sqrt_rn store sum to trans view
    xor_sum dtype element_ty shape numel value is_floating is_int is_ptr is_fp16 is_bf16 is_fp32 is_fp64
    is_fp8 primitive_bitwidth scalar
""")
