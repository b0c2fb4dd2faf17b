"""Code to evaluate and train on: the standard library's file-level splits, line-completion cuts
(Python, the JDK's Java), HumanEval and its infilling variants."""
