"""pytorchexample: Flower's quickstart-pytorch app, asynchronous through asyncfl."""
