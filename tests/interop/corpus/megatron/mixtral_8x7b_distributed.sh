#!/bin/bash
# The Mixtral example's small MoE (2 layers, 2 experts, expert parallel 2 on 2 GPUs). Flags and
# values from Megatron-LM examples/mixtral/train_mixtral_8x7b_distributed.sh
# (commit 0a40979ee868697bd66157ab800d213ffff030d8). The vocabulary comes from the Llama 2
# tokenizer model, which a launch script does not state.
GPUS_PER_NODE=2
NNODES=${SLURM_NNODES:-"1"}
TOKENIZER_MODEL=/workspace/Megatron-LM/tokenizer.model

DISTRIBUTED_ARGS=(--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES)

MODEL_ARGS=(
    --use-mcore-models --disable-bias-linear
    --seq-length 256 --max-position-embeddings 2048
    --num-layers 2 --hidden-size 256 --ffn-hidden-size 896 --num-attention-heads 2
    --normalization RMSNorm --position-embedding-type rope --swiglu
    --untie-embeddings-and-output-weights
    --group-query-attention --num-query-groups 2
)
MOE_ARGS=(
    --num-experts 2 --moe-router-topk 2
    --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2
#    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
)
TRAINING_ARGS=(
    --micro-batch-size 1 --global-batch-size 4 --lr 1e-4 --train-iters 7
    --min-lr 1.0e-5 --weight-decay 0.1 --clip-grad 1.0
    # --bf16
)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1
    --expert-model-parallel-size 2 --use-distributed-optimizer --sequence-parallel
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${MODEL_ARGS[@]} ${MOE_ARGS[@]} \
    --tokenizer-type Llama2Tokenizer --tokenizer-model ${TOKENIZER_MODEL} --mock-data \
    ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]}
