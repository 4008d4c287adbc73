#!/bin/bash
# DeepSeek-V3 on 1024 H100 GPUs (128 nodes of 8) with an uneven pipeline layout: the parallel
# sizes, batch, recompute and layout of Megatron-Bridge's H100 BF16 performance recipe
# (perf_recipes/deepseek/h100/deepseek_v3.py @ 067f987d) written as the Megatron-LM flags they
# are (the recipe keeps gradients in bf16 and sets expert TP 1), with DeepSeek-V3's shape. The
# layout `Et|(tt|)*30mL` gives 32 virtual stages over PP 8, so Megatron-LM derives 4 virtual
# stages per rank without --virtual-pipeline-model-parallel-size.
DISTRIBUTED_ARGS=(--nproc_per_node 8 --nnodes 128)

MODEL_ARGS=(
    --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432
    --num-attention-heads 128 --seq-length 4096 --max-position-embeddings 4096
    --vocab-size 129280 --normalization RMSNorm --swiglu --position-embedding-type rope
    --untie-embeddings-and-output-weights
    --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512
    --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128
    --num-experts 256 --moe-router-topk 8 --moe-ffn-hidden-size 2048
    --moe-shared-expert-intermediate-size 2048 --moe-layer-freq "([0]*3+[1]*58)"
    --moe-router-score-function sigmoid --moe-router-enable-expert-bias
    --moe-router-bias-update-rate 1e-3 --moe-aux-loss-coeff 1e-4
    --moe-router-num-groups 8 --moe-router-group-topk 4 --moe-router-topk-scaling-factor 2.5
    --mtp-num-layers 1
)

PARALLEL_ARGS=(
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 8
    --pipeline-model-parallel-layout "Et|(tt|)*30mL"
    --expert-model-parallel-size 64 --expert-tensor-parallel-size 1 --sequence-parallel
    --use-distributed-optimizer
)

TRAINING_ARGS=(
    --micro-batch-size 1 --global-batch-size 16384 --bf16 --grad-reduce-in-bf16
    --recompute-granularity selective --recompute-modules mla_up_proj mlp
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} ${PARALLEL_ARGS[@]} ${TRAINING_ARGS[@]}
