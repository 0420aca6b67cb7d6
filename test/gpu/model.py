"""Model workload for the benchmark: a Llama-shaped transformer (random bf16 weights, built
from a local config: nothing is downloaded) that serves greedy generation.

Usage: model.py DIR. Follows holder.py's protocol: DIR/ready once loaded; on DIR/verify it
generates again and writes DIR/resultK with same=True when every weight is bit-identical and
the generated tokens are too. Before that whole check it generates ONE token and writes
DIR/firstK ("first=True|False t=<time.time()>"), the first token it would serve checked
against the wanted generation's: a restored model touched for verify before its restore
says when it answered again (bench-stream.sh times the restore's start to that file).
Kernels are deterministic (torch's deterministic algorithms, a fixed cuBLAS workspace), so
that generation itself repeats exactly.
"""
import os, sys, time
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.use_deterministic_algorithms(True)

d = sys.argv[1]
torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=3072, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=24,
                  num_key_value_heads=8, vocab_size=32000, max_position_embeddings=2048)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
prompt = torch.randint(0, cfg.vocab_size, (1, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(1))

def generate(n=32):
    with torch.no_grad():
        return model.generate(prompt, max_new_tokens=n, do_sample=False, pad_token_id=0).tolist()

def first_token():
    return generate(1)[0][prompt.shape[1]]

def weights():
    s = 0
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            v = t.detach().contiguous().view(-1)
            v = v.view(torch.int16) if v.element_size() == 2 else v.view(torch.int32)
            for c in v.split(1 << 26):
                s ^= int((c.long() * 2654435761).sum().item())
    return s

generate()  # the first call picks kernels and warms caches; later calls agree with each other
want = generate(); w0 = weights()
want_first = want[0][prompt.shape[1]]
# The one-token check is worth something only if it agrees with the whole generation here.
if first_token() != want_first:
    sys.exit("model.py: one generated token differs from the first of the whole generation: kernels not deterministic")
torch.cuda.synchronize(); torch.cuda.empty_cache()
params = sum(p.numel() for p in model.parameters())
open(f"{d}/ready.tmp", "w").write(f"{os.getpid()} {params}\n"); os.rename(f"{d}/ready.tmp", f"{d}/ready")
k = 0
while True:
    if os.path.exists(f"{d}/verify"):
        os.unlink(f"{d}/verify"); k += 1
        first = first_token() == want_first
        open(f"{d}/first{k}.tmp", "w").write(f"first={first} t={time.time():.6f}\n")
        os.rename(f"{d}/first{k}.tmp", f"{d}/first{k}")
        tokens, same_w = generate() == want, weights() == w0
        open(f"{d}/result{k}", "w").write(f"same={tokens and same_w} weights={same_w} tokens={tokens} params={params}\n")
    time.sleep(0.01)  # polled often: the first-token time includes this wait
