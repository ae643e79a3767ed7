"""The kernels the engine process runs: attention, products, quantized ops, and the native
CPU kernels the model runner, the codecs' streaming decoders and the sampler call.

==========================  ==================================================================
module                      what it holds
==========================  ==================================================================
``attention_context``       what attention needs to know about one step (slots, page tables)
``torch_attention``         paged attention in torch: the reference, and the CPU's path
``attention_backends``      the :class:`AttentionBackend` protocol, torch and Triton backends,
                            the one choice of a backend for a device
``decode_attention``        :func:`paged_decode_attention`: the chosen backend's decode
                            (Triton wherever it can run, its interpreter included; else torch)
``triton_decode_attention`` the Triton paged decode kernel (GQA packing, split-K, int8 pages)
``triton_support``          whether Triton is installed and can run on a device
``dense_decode_kv``         the CPU torch path's dense copy of decoding keys, kept between steps
``fused_cpu_decode``        a decoder stack's CPU step in one native call (cpu_decode_layers)
``fusable_decoder``         what that step reads from a model and a cache (protocols)
``kv_quant``                int8 KV: per-token, per-head float16 scales
``linear_swap``             replaces a model's linear layers in place
``cpu_linear``              CPU linears: prepacked for oneDNN (fp32 or bf16), or cadenza's
                            native bf16 product (``cpu_bf16_linear``) where it is faster
``packed_product``          the weight layout of the native products (``cpu_product.h``)
``cpu_elu``                 the codec decoders' ELU through a native kernel
``cpu_lstm``                the streaming codec's LSTM through a native kernel
``cpu_mono_conv``           a conv to one output channel through a native kernel
``cpu_sampling``            the sampler's thresholded draw through a native kernel
``native``                  the C++ kernels: sources, their one table, one loader, ISA levels
``int8_linear``             weight-only int8 linears (W8A16)
``triton_int8_linear``      the W8A16 Triton kernel
==========================  ==================================================================

Everything that attends goes through an :class:`AttentionBackend`: the model layers call
their device's backend for a whole step (store the step's keys and values, then ``decode`` for
the decode tokens, ``prefill`` for each chunk), and :func:`paged_decode_attention` calls the
chosen backend's ``decode``. :func:`attention_backend_for` is the one rule: Triton where its
kernels run compiled (CUDA, Triton installed) for fp16, bf16 and fp32, torch everywhere else;
prefill chunks use SDPA over gathered pages on every device. ``make gpu-check`` compiles,
checks and measures the Triton kernels on a CUDA machine.

What a step runs on the CPU, fastest first:

* a Llama backbone's whole step in one native call (``fused_cpu_decode``, ``cpu.fused_decode``,
  on by default) where the model, the cache's dtype and the widths allow: every token a row,
  attending its own sequence's pages in place, so no row pays for another's context;
* otherwise torch: a Llama's q/k/v and gate/up fused, linears prepacked for oneDNN or on the
  native bf16 product (``cpu_linear``), decode attention one gather + SDPA per layer, and from
  256 positions on a dense copy of the decoding keys kept between steps (``dense_decode_kv``).

The codecs' ELU, LSTM and output conv and the sampler's draw have native kernels of their own;
each wrapper keeps its torch path where its kernel cannot load (:mod:`cadenza.kernels.native`).
Kernels import no model family and no engine part: what the fused step reads from a model and
a cache are protocols (``fusable_decoder``).
"""

from cadenza.kernels.decode_attention import paged_decode_attention

__all__ = ["paged_decode_attention"]
