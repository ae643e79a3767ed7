"""Attention and quantized-op kernels the model runner calls (engine process).

==========================  ==================================================================
module                      what it holds
==========================  ==================================================================
``attention_context``       what attention needs to know about one step (slots, page tables)
``torch_attention``         paged attention in torch: the reference, and the CPU's path
``decode_attention``        :func:`paged_decode_attention`: Triton when it can run, else torch
``triton_decode_attention`` the Triton paged decode kernel (GQA packing, split-K, int8 pages)
``attention_backends``      what the model layers call: torch (CPU), Triton decode (CUDA)
``kv_quant``                int8 KV: per-token, per-head float16 scales
``linear_swap``             replaces a model's linear layers in place
``cpu_linear``              fp32 linears prepacked for oneDNN; the native bf16 product
``fused_cpu_decode``        a Llama stack's CPU step in one native call
``cpu_elu``                 the codec decoders' ELU through a native kernel
``cpu_lstm``                the streaming codec's LSTM through a native kernel
``cpu_mono_conv``           a conv to one output channel through a native kernel
``cpu_sampling``            the sampler's thresholded draw through a native kernel
``native``                  the C++ kernels: sources, their one table, one loader, ISA levels
``int8_linear``             weight-only int8 linears (W8A16)
``triton_int8_linear``      the W8A16 Triton kernel
==========================  ==================================================================
"""

from cadenza.kernels.decode_attention import paged_decode_attention

__all__ = ["paged_decode_attention"]
