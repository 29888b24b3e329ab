"""The models the GPU suite trains (record_traces.py, sweep.py): a decoder-only
transformer LM and a 2-layer GCN with gather + index_add_ message passing."""

LM_VOCAB, LM_WIDTH, LM_LAYERS, LM_HEADS = 8192, 512, 6, 8
GCN_FEATURES, GCN_HIDDEN, GCN_CLASSES, GCN_DEGREE = 128, 256, 16, 10


def transformer_lm(torch):
    """The LM on the GPU: embedding, LM_LAYERS pre-norm blocks (causal
    attention, GELU MLP), a final norm and the vocabulary projection."""
    nn, F = torch.nn, torch.nn.functional
    width, heads = LM_WIDTH, LM_HEADS

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x):
            b, t, w = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, heads, w // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, w))
            return x + self.ff(self.norm2(x))

    return nn.Sequential(nn.Embedding(LM_VOCAB, width), *[Block() for _ in range(LM_LAYERS)],
                         nn.LayerNorm(width), nn.Linear(width, LM_VOCAB)).to(torch.device("cuda"))


def lm_loss(torch, model, tokens):
    """Next-token cross entropy of `model` on `tokens` (batch, sequence + 1), bf16 autocast."""
    F = torch.nn.functional
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, LM_VOCAB), tokens[:, 1:].reshape(-1))


def gcn_weights(torch):
    """The GCN's two weight matrices (GCN_FEATURES -> GCN_HIDDEN -> GCN_CLASSES)."""
    dev = torch.device("cuda")
    w1 = torch.nn.Parameter(torch.randn(GCN_FEATURES, GCN_HIDDEN, device=dev) * GCN_FEATURES ** -0.5)
    w2 = torch.nn.Parameter(torch.randn(GCN_HIDDEN, GCN_CLASSES, device=dev) * GCN_HIDDEN ** -0.5)
    return w1, w2


def gcn_graph(torch, nodes):
    """A random graph of `nodes` nodes and GCN_DEGREE edges per node: sources,
    destinations and the symmetric normalisation of each edge."""
    dev = torch.device("cuda")
    src = torch.randint(0, nodes, (GCN_DEGREE * nodes,), device=dev)
    dst = torch.randint(0, nodes, (GCN_DEGREE * nodes,), device=dev)
    deg = torch.ones(nodes, device=dev).index_add_(0, dst, torch.ones(GCN_DEGREE * nodes, device=dev))
    return src, dst, (deg[src] * deg[dst]).rsqrt().unsqueeze(1)


def gcn_loss(torch, graph, x, labels, w1, w2):
    """Two rounds of message passing (gather + index_add_) and the classification loss."""
    src, dst, norm = graph

    def propagate(h):
        return torch.zeros_like(h).index_add_(0, dst, h[src] * norm)

    h = torch.relu(propagate(x @ w1))
    return torch.nn.functional.cross_entropy(propagate(h @ w2), labels)
