-- spec/options/sequence.lua - the options tables of the sequence pieces
-- (issue 20): scaled_dot_product_attention, ctc_loss, the decoder modules,
-- CTCLoss, PyTorch's encoder-decoder nn.Transformer{...} and the forward
-- options of the decoder and the Transformer. Merged into options_spec.lua.
return function(nd)
  local nn, F = nd.nn, nd.F
  local x = nd.randn({3, 2, 4})
  local DECODER_CALL = "memory_is_causal, memory_key_padding_mask, memory_mask, tgt_is_causal, tgt_key_padding_mask, " ..
                       "tgt_mask"
  -- small sizes: PyTorch's defaults build a 44M-parameter model
  local function small(o)
    for k, v in pairs({d_model = 4, nhead = 2, num_encoder_layers = 1, num_decoder_layers = 1, dim_feedforward = 4}) do
      if o[k] == nil then o[k] = v end
    end
    return o
  end
  local transformer = nn.Transformer(small({dropout = 0}))
  local layer = nn.TransformerDecoderLayer(4, 2, {dim_feedforward = 4})
  local lp = nd.randn({4, 2, 3}):log_softmax(3)
  local targets = nd.tensor({{2, 3}, {2, 2}}, {dtype = "int64"})
  return {
    nn = {
      TransformerDecoderLayer = {"activation, batch_first, bias, device, dim_feedforward, dropout, dtype, " ..
                                 "layer_norm_eps, norm_first", function(o) return nn.TransformerDecoderLayer(4, 2, o) end},
      TransformerDecoder = {"norm", function(o) return nn.TransformerDecoder(layer, 2, o) end},
      CTCLoss = {"blank, reduction, zero_infinity", function(o) return nn.CTCLoss(o) end},
    },
    nn_none = {ModuleDict = "takes modules", ParameterList = "takes tensors", ParameterDict = "takes tensors"},
    F = {
      scaled_dot_product_attention = {"attn_mask, dropout_p, is_causal, scale",
                                      function(o) return F.scaled_dot_product_attention(x, x, x, o) end},
      ctc_loss = {"blank, reduction, zero_infinity", function(o) return F.ctc_loss(lp, targets, {4, 4}, {2, 2}, o) end},
    },
    rest = {
      {"nn.Transformer", "activation, batch_first, bias, custom_decoder, custom_encoder, d_model, device, " ..
       "dim_feedforward, dropout, dtype, layer_norm_eps, nhead, norm_first, num_decoder_layers, num_encoder_layers",
       function(o) return nn.Transformer(small(o)) end},
      {"nn.Transformer(d_model=4, nhead=2)", "memory_is_causal, memory_key_padding_mask, memory_mask, src_is_causal, " ..
       "src_key_padding_mask, src_mask, tgt_is_causal, tgt_key_padding_mask, tgt_mask",
       function(o) return transformer(x, x, o) end},
      {"nn.TransformerDecoderLayer(4, 2)", DECODER_CALL, function(o) return layer(x, x, o) end},
      {"nn.TransformerDecoder", DECODER_CALL, function(o) return nn.TransformerDecoder(layer, 1)(x, x, o) end},
    },
  }
end
