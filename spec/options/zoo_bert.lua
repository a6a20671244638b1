-- spec/options/zoo_bert.lua - the options tables of BERT and DistilBERT in needle
-- (issue 21): the BertConfig / DistilBertConfig fields of the nd.nn.models
-- constructors, their forward options, and convert.model('bert') /
-- convert.model('distilbert'). Merged into options_spec.lua.
return function(nd)
  local models = nd.nn.models
  local FACTORY = "device, dtype, "
  local BERT = "attention_probs_dropout_prob, " .. FACTORY .. "hidden_act, hidden_dropout_prob, hidden_size, " ..
               "initializer_range, intermediate_size, layer_norm_eps, max_position_embeddings, num_attention_heads, " ..
               "num_hidden_layers, pad_token_id, type_vocab_size, vocab_size"
  local DISTIL = "activation, attention_dropout, device, dim, dropout, dtype, hidden_dim, initializer_range, " ..
                 "max_position_embeddings, n_heads, n_layers, pad_token_id, sinusoidal_pos_embds, vocab_size"
  -- small sizes: the defaults build BERT-base (110M parameters) and distilbert-base
  local function small(o, sizes)
    for k, v in pairs(sizes) do
      if o[k] == nil then o[k] = v end
    end
    return o
  end
  local B = {vocab_size = 10, hidden_size = 8, num_hidden_layers = 1, num_attention_heads = 2, intermediate_size = 8,
             max_position_embeddings = 8}
  local DB = {vocab_size = 10, dim = 8, n_layers = 1, n_heads = 2, hidden_dim = 8, max_position_embeddings = 8}
  local function bert(o) return small(o, B) end
  local function distil(o) return small(o, DB) end
  local bert_model = models.BertModel(bert({})):eval()
  local cls = models.BertForSequenceClassification(bert({})):eval()
  local mlm = models.BertForMaskedLM(bert({})):eval()
  local dmodel = models.DistilBertModel(distil({})):eval()
  local dcls = models.DistilBertForSequenceClassification(distil({})):eval()
  local qa = models.BertForQuestionAnswering(bert({})):eval()
  local dtok = models.DistilBertForTokenClassification(distil({})):eval()
  local ids = nd.tensor({{2, 3, 4}}, {dtype = "int64"})
  local FORWARD = "attention_mask, position_ids, token_type_ids"
  return {
    models = {
      BertModel = {"add_pooling_layer, " .. BERT, function(o) return models.BertModel(bert(o)) end},
      BertForSequenceClassification = {BERT:gsub("attention_probs_dropout_prob, ",
                                                 "attention_probs_dropout_prob, classifier_dropout, ")
                                           :gsub("num_hidden_layers, ", "num_hidden_layers, num_labels, "),
                                       function(o) return models.BertForSequenceClassification(bert(o)) end},
      BertForMaskedLM = {BERT, function(o) return models.BertForMaskedLM(bert(o)) end},
      DistilBertModel = {DISTIL, function(o) return models.DistilBertModel(distil(o)) end},
      DistilBertForSequenceClassification = {DISTIL:gsub("n_layers, ", "n_layers, num_labels, ")
                                                 :gsub("pad_token_id, ", "pad_token_id, seq_classif_dropout, "),
                                             function(o) return models.DistilBertForSequenceClassification(distil(o)) end},
      BertForTokenClassification = {BERT:gsub("attention_probs_dropout_prob, ",
                                              "attention_probs_dropout_prob, classifier_dropout, ")
                                        :gsub("num_hidden_layers, ", "num_hidden_layers, num_labels, "),
                                    function(o) return models.BertForTokenClassification(bert(o)) end},
      BertForQuestionAnswering = {BERT:gsub("num_hidden_layers, ", "num_hidden_layers, num_labels, "),
                                  function(o) return models.BertForQuestionAnswering(bert(o)) end},
      DistilBertForTokenClassification = {DISTIL:gsub("n_layers, ", "n_layers, num_labels, "),
                                          function(o) return models.DistilBertForTokenClassification(distil(o)) end},
      DistilBertForQuestionAnswering = {DISTIL:gsub("n_layers, ", "n_layers, num_labels, ")
                                            :gsub("pad_token_id, ", "pad_token_id, qa_dropout, "),
                                        function(o) return models.DistilBertForQuestionAnswering(distil(o)) end},
    },
    rest = {
      {"nn.models.BertModel", FORWARD, function(o) return bert_model(ids, o) end},
      {"nn.models.BertForSequenceClassification", FORWARD, function(o) return cls(ids, o) end},
      {"nn.models.BertForMaskedLM", FORWARD, function(o) return mlm(ids, o) end},
      {"nn.models.DistilBertModel", "attention_mask", function(o) return dmodel(ids, o) end},
      {"nn.models.DistilBertForSequenceClassification", "attention_mask", function(o) return dcls(ids, o) end},
      {"nn.models.BertForQuestionAnswering", FORWARD, function(o) return qa(ids, o) end},
      {"nn.models.DistilBertForTokenClassification", "attention_mask", function(o) return dtok(ids, o) end},
      {"convert.model('bert')", "convert_dtype, hidden_act, layer_norm_eps, mapping, nhead, num_attention_heads, "
       .. "pad_token_id, strict", function(o)
         o.nhead = o.nhead or 2
         return nd.convert.model("bert", bert_model:state_dict(), o)
       end},
      {"convert.model('distilbert')", "activation, convert_dtype, mapping, n_heads, nhead, pad_token_id, strict",
       function(o)
         o.nhead = o.nhead or 2
         return nd.convert.model("distilbert", dmodel:state_dict(), o)
       end},
    },
  }
end
