#!/bin/bash
# Llama 3 8B with FP8 on one 8-GPU H100 node. Flags and values from Megatron-LM
# examples/llama/train_llama3_8b_h100_fp8.sh (commit 157006d6d9bf4f55c0d4d7dacbd2b65e7bd84dc9),
# rearranged: same variables, arrays and quoted array items as the original.
CHECKPOINT_PATH=${1:-"checkpoints/llama3_8b_fp8"}
GPUS_PER_NODE=8
NUM_NODES=1
TP_SIZE=1
CP_SIZE=1
MICRO_BATCH_SIZE=1
GLOBAL_BATCH_SIZE=128
NUM_LAYERS=32
SEQ_LENGTH=8192

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr ${MASTER_ADDR:-localhost}
)

MODEL_ARGS=(
    --use-mcore-models
    --num-layers $NUM_LAYERS
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --kv-channels 128
    --seq-length $SEQ_LENGTH
    --max-position-embeddings 8192
    --position-embedding-type rope
    --rotary-base 1000000
    --swiglu
    --untie-embeddings-and-output-weights
    --disable-bias-linear
)

TRAINING_ARGS=(
    --micro-batch-size $MICRO_BATCH_SIZE
    --global-batch-size $GLOBAL_BATCH_SIZE
    --lr 0.00015
    --min-lr 0.00001
    --clip-grad 1.0
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --bf16
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)

DTYPE_ARGS=(
    "--fp8-format hybrid"
    "--fp8-amax-history-len 1024"
    "--fp8-amax-compute-algo max"
    "--fp8-param-gather"
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP_SIZE
    --context-parallel-size $CP_SIZE
    --sequence-parallel
)

DATA_ARGS=(
    "--mock-data"
    "--tokenizer-type NullTokenizer"
    "--vocab-size 128256"
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} ${TRAINING_ARGS[@]} ${DTYPE_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} ${DATA_ARGS[@]} \
    --log-interval 1 --save-interval 1000 --save "$CHECKPOINT_PATH"
