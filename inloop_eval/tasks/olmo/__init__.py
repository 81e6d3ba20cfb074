"""`olmo:<label>` tasks: every label of OLMo's in-loop evaluation (ai2-olmo-eval 0.9.0), rendered and tokenized
as OLMo does.

- `base`: what every `olmo:` task shares, and `OLMoFormat`, the mixin that makes a native task OLMo's (OLMo's
  pair encoding, domain conditionals, metric type and laxer checks);
- `formats`: OLMo's hand-written formats, each `OLMoFormat` over a native task (`OLMoPIQA(OLMoFormat, PIQA)`),
  overriding only the methods whose rendering differs;
- `mmlu`: OLMo's MMLU (its categories' subject order, prompt variations, letter keys), over the native MMLU;
- `oe_eval`: OLMo's labels over oe-eval request files, over the `oe_eval:` task;
- `labels`: the 252 labels and the `olmo:` resolver.
"""
