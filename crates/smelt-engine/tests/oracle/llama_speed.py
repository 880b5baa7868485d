"""llama.cpp's prompt and decode speed: llama_speed.py MODEL [THREADS] [PROMPT] [GEN].
Prints `pp<PROMPT> <tok/s> tg<GEN> <tok/s>` like smelt-engine's engine_speed example."""
import sys
import time

from llama_cpp import Llama


def main():
    model = sys.argv[1]
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    n_prompt = int(sys.argv[3]) if len(sys.argv) > 3 else 512
    n_gen = int(sys.argv[4]) if len(sys.argv) > 4 else 128
    llm = Llama(model_path=model, n_ctx=n_prompt + n_gen + 16, n_batch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    n_vocab = llm.n_vocab()
    prompt = [(i * 2654435761 + 17) % (n_vocab - 10) + 5 for i in range(n_prompt)]
    llm.eval(prompt[:32])  # warm up
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    pp = time.perf_counter() - t
    tok = 100
    t = time.perf_counter()
    for _ in range(n_gen):
        llm.eval([tok])
    tg = time.perf_counter() - t
    print(f"pp{n_prompt} {n_prompt / pp:.1f} tg{n_gen} {n_gen / tg:.1f}")


if __name__ == "__main__":
    main()
