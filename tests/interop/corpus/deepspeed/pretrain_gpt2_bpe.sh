#!/bin/bash
# A Megatron-DeepSpeed GPT run in the style of examples_deepspeed/pretrain_llama2_distributed.sh
# (microsoft/Megatron-DeepSpeed, commit b644fba3b2b1057f568ea80aaa725b55b957bb3b): the same
# variables, the DeepSpeed arguments built up in a string, TP 2, PP 2, ZeRO stage 0, micro batch
# 4, global batch 32, bf16. The original writes its ds_config with a here-document, which planc
# does not run; it is the file deepspeed.json beside this script. The model here is GPT-2 medium
# with the GPT-2 BPE tokenizer (24 layers, hidden 1024, 16 heads, vocabulary 50,257), so the
# vocabulary is known without running a tokenizer.
DS_CONFIG=deepspeed.json
TP=2
PP=2
ZERO_STAGE=0
GPUS_PER_NODE=8
NNODES=1
NODE_RANK=0
HIDDEN_SIZE=1024
NUM_LAYERS=24
NUM_HEADS=16
SEQ_LENGTH=1024
MICRO_BATCH_SIZE=4
GLOBAL_BATCH_SIZE=32
TRAIN_STEPS=250000
LR=3e-4
MIN_LR=3e-5
LR_WARMUP_STEPS=2000
WEIGHT_DECAY=0.1
GRAD_CLIP=1

ds_args=""
ds_args=" --deepspeed ${ds_args}"
ds_args=" --deepspeed_config=$DS_CONFIG ${ds_args}"
ds_args=" --zero-stage=$ZERO_STAGE ${ds_args}"

DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK"

torchrun $DISTRIBUTED_ARGS \
       pretrain_gpt.py \
       --tensor-model-parallel-size $TP \
       --pipeline-model-parallel-size $PP \
       --num-layers $NUM_LAYERS \
       --hidden-size $HIDDEN_SIZE \
       --num-attention-heads $NUM_HEADS \
       --micro-batch-size $MICRO_BATCH_SIZE \
       --global-batch-size $GLOBAL_BATCH_SIZE \
       --seq-length $SEQ_LENGTH \
       --max-position-embeddings $SEQ_LENGTH \
       --train-iters $TRAIN_STEPS \
       --tokenizer-type GPT2BPETokenizer \
       --lr $LR \
       --lr-decay-style cosine \
       --min-lr $MIN_LR \
       --weight-decay $WEIGHT_DECAY \
       --clip-grad $GRAD_CLIP \
       --lr-warmup-iters $LR_WARMUP_STEPS \
       --optimizer adam \
       --adam-beta1 0.9 \
       --adam-beta2 0.95 \
       --bf16 \
       $ds_args
