"""Qwen3.5's multi-token-prediction (MTP) head in PyTorch, for golden fixtures and training.

transformers loads Qwen3.5 checkpoints without their mtp.* tensors (it never runs the head), so
this is the module as the serving engines that draft with it compute it (vLLM's
Qwen3_5MultiTokenPredictor; SGLang's Qwen3.5 MTP is the same math), built from transformers' own
Qwen3.5 layers so that every norm, the gated attention and the partial RoPE are exactly the
model's:

    e   = pre_fc_norm_embedding(embed_tokens[next_id])    zero-centred RMSNorms (scale 1 + w)
    h   = pre_fc_norm_hidden(hidden)                     hidden: the model's final-norm output
    x   = fc([e ; h])                                    fc: Linear(2H -> H), no bias
    x   = decoder_layer(x)                               a full-attention layer, causal over
                                                         the head's own rows
    out = norm(x);  logits = lm_head(out)                embedding and lm_head: the model's

Row i pairs the model's hidden state at position i with the token at position i + 1 and predicts
the token at i + 2; it sits at position i (RoPE), like the model's row it extends. A chain of
drafts feeds each row's `out` back as the next row's hidden, with the token it predicted.
"""

import torch
from torch import nn
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm

MTP_PREFIX = "mtp."


def text_parts(model):
    """(text model, lm_head) of a Qwen3_5ForCausalLM or Qwen3_5ForConditionalGeneration."""
    inner = model.model
    text = inner.language_model if hasattr(inner, "language_model") else inner
    return text, model.lm_head


class MtpHead(nn.Module):
    def __init__(self, text_config):
        super().__init__()
        H, eps = text_config.hidden_size, text_config.rms_norm_eps
        # The decoder layer reads its kind from layer_types: any full-attention index will do.
        full = text_config.layer_types.index("full_attention")
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(H, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(H, eps=eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(text_config, full)])
        self.norm = Qwen3_5RMSNorm(H, eps=eps)

    def forward(self, hidden, next_ids, embed_tokens, rotary_emb, first_position=0):
        """hidden: [B, n, H]; next_ids: [B, n]. Returns out [B, n, H], causal over the n rows."""
        n = next_ids.shape[1]
        e = self.pre_fc_norm_embedding(embed_tokens(next_ids))
        h = self.pre_fc_norm_hidden(hidden)
        x = self.fc(torch.cat([e, h], dim=-1))
        positions = torch.arange(first_position, first_position + n).unsqueeze(0)
        position_embeddings = rotary_emb(x, positions)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None].to(x.dtype)
        x = self.layers[0](x, position_embeddings=position_embeddings, attention_mask=mask)
        return self.norm(x)

    def load_from(self, tensors):
        """Binds the checkpoint's mtp.* tensors (layer 0), upcast to f32."""
        def wanted(k):
            if not k.startswith(MTP_PREFIX):
                return False
            return not k.startswith(MTP_PREFIX + "layers.") or k.startswith(MTP_PREFIX + "layers.0.")
        own = {k[len(MTP_PREFIX):]: v.float() for k, v in tensors.items() if wanted(k)}
        missing, unexpected = self.load_state_dict(own, strict=False)
        assert not missing and not unexpected, (missing, unexpected)

    def state_tensors(self):
        """The head's parameters under their checkpoint names."""
        return {MTP_PREFIX + k: v.detach() for k, v in self.state_dict().items()}


def mtp_logits_and_chain(model, head, ids, next_id, n_chain):
    """The head over a prompt: logits of every row i (the model's hidden at i with ids[i + 1],
    the last row with next_id), then a greedy chain of n_chain more drafts. Returns
    (row_logits [n, V], chain_ids [n_chain], chain_logits [n_chain, V])."""
    text, lm_head = text_parts(model)
    x = torch.tensor([ids], dtype=torch.int64)
    hidden = text(input_ids=x, use_cache=False).last_hidden_state  # after the final norm
    pairs = list(ids[1:]) + [next_id]
    hiddens, tokens = hidden, torch.tensor([pairs], dtype=torch.int64)
    out = head(hiddens, tokens, text.embed_tokens, text.rotary_emb)
    row_logits = lm_head(out)[0]
    chain_ids, chain_logits = [], []
    for _ in range(n_chain):
        draft = int(torch.argmax(lm_head(out[:, -1:])[0, -1]))
        hiddens = torch.cat([hiddens, out[:, -1:]], dim=1)
        tokens = torch.cat([tokens, torch.tensor([[draft]])], dim=1)
        out = head(hiddens, tokens, text.embed_tokens, text.rotary_emb)
        chain_ids.append(draft)
        chain_logits.append(lm_head(out[:, -1])[0])
    return row_logits, chain_ids, torch.stack(chain_logits) if chain_logits else None
