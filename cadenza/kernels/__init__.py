"""Attention and quantized-op kernels the model runner calls (engine process).

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
``kv_quant``                int8 KV: per-token, per-head float16 scales
``linear_swap``             replaces a model's linear layers in place
``cpu_linear``              fp32 linears prepacked for oneDNN
``int8_linear``             weight-only int8 linears (W8A16)
``triton_int8_linear``      the W8A16 Triton kernel
==========================  ==================================================================
"""

from cadenza.kernels.decode_attention import paged_decode_attention

__all__ = ["paged_decode_attention"]
