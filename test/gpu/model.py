"""Model workload for the benchmark: a Llama-shaped transformer (random bf16 weights, built
from a local config: nothing is downloaded) that serves greedy generation.

Usage: model.py DIR. Follows holder.py's protocol: DIR/ready once loaded; on DIR/verify it
generates again and writes DIR/resultK with same=True when the tokens are identical.
"""
import os, sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM

d = sys.argv[1]
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=3072, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=24,
                  num_key_value_heads=8, vocab_size=32000, max_position_embeddings=2048)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
prompt = torch.randint(0, cfg.vocab_size, (1, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(1))

def generate():
    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=32, do_sample=False, pad_token_id=0).tolist()

generate()  # the first call picks kernels and warms caches; later calls agree with each other
want = generate(); torch.cuda.synchronize()
params = sum(p.numel() for p in model.parameters())
open(f"{d}/ready.tmp", "w").write(f"{os.getpid()} {params}\n"); os.rename(f"{d}/ready.tmp", f"{d}/ready")
k = 0
while True:
    if os.path.exists(f"{d}/verify"):
        os.unlink(f"{d}/verify"); k += 1
        open(f"{d}/result{k}", "w").write(f"same={generate() == want} params={params}\n")
    time.sleep(0.05)
